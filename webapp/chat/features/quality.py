"""A dictionary's quality on held-out text, as SAELens and the SAEBench papers report it:

    explained variance   1 − Σ‖x − x̂‖² / Σ‖x − mean(x)‖², over every held-out token's stream
    L0                   features active per token, on average
    dead                 the fraction of features active on no held-out token (dead_fraction: over a window of a
                         million tokens or so, as SAELens counts it; over a few thousand, "dead" mostly means rare)
    loss recovered       (CE_zero − CE_spliced) / (CE_zero − CE_clean): the next-token cross-entropy with the
                         stream after the block replaced by its reconstruction x̂ (spliced), by zeros
                         (zero-ablated), and untouched (clean)

The splice is the hooked forward's additive edit, x ← x + (x̂ − x) at every position but the first (the start
token's stream is left as it is, as SAELens's evaluations leave it), so the spliced run is the model's own
forward with only that stream changed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from webapp.chat.features.activations import activations
from webapp.chat.features.sae import Dictionary
from webapp.chat.model import hooked
from webapp.chat.model.edits import Edit, ResidAdd


@dataclass(frozen=True)
class Quality:
    explained_variance: float
    l0: float
    dead_fraction: float
    ce_clean: float
    ce_spliced: float
    ce_zero: float
    tokens: int

    @property
    def loss_recovered(self) -> float:
        span = self.ce_zero - self.ce_clean
        return float("nan") if span == 0 else (self.ce_zero - self.ce_spliced) / span


@torch.inference_mode()
def quality(model: Any, sae: Dictionary, held_out: Sequence[Sequence[int]]) -> Quality:
    """The figures over held-out sequences (each [bos, ...], run one at a time)."""
    layer = sae.config.layer
    device = model.transformer.wte.weight.device
    error = total = active = 0.0
    fired = torch.zeros(sae.config.d_sae, dtype=torch.bool)
    rows: list[torch.Tensor] = []
    losses = {"clean": 0.0, "spliced": 0.0, "zero": 0.0}
    tokens = 0
    for seq in held_out:
        ids = torch.tensor([list(seq)], dtype=torch.long, device=device)
        clean = hooked.run(model, hooked.embed(model, ids), reads=hooked.Reads(resid=True,
                                                                               layers=frozenset({layer + 1})))
        x = clean.resid[layer + 1][0].float()  # (T, C)
        z, x_hat = sae.to(x.device)(x[1:])
        active += float((z > 0).sum())
        fired |= (z > 0).any(0).cpu()
        rows.append(x[1:].cpu())
        error += float(((x_hat - x[1:]) ** 2).sum())
        targets = ids[0, 1:]
        losses["clean"] += _ce(model, clean.x, targets)
        for name, replacement in (("spliced", x_hat), ("zero", torch.zeros_like(x_hat))):
            delta = torch.cat([torch.zeros_like(x[:1]), replacement - x[1:]]).to(clean.x.dtype)  # (T, C)
            run = hooked.run(model, hooked.embed(model, ids), edits=Edit(adds=(ResidAdd(layer, delta),)))
            losses[name] += _ce(model, run.x, targets)
        tokens += len(seq) - 1
    stacked = torch.cat(rows)
    total = float(((stacked - stacked.mean(0)) ** 2).sum())
    n = len(held_out)
    return Quality(1.0 - error / max(total, 1e-12), active / max(tokens, 1), 1.0 - float(fired.float().mean()),
                   losses["clean"] / n, losses["spliced"] / n, losses["zero"] / n, tokens)


def _ce(model: Any, x: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean next-token cross-entropy of a run's final stream x (1, T, C) against targets (T − 1,)."""
    logits = model.lm_head(model.transformer.ln_f(x[0, :-1])).float()
    return float(F.cross_entropy(logits, targets))


@torch.inference_mode()
def dead_fraction(model: Any, sae: Dictionary, seqs: Iterator[list[int]], batch: int = 16) -> tuple[float, int]:
    """(the fraction of features active on none of the tokens, the tokens read) over sequences each [bos, ...]
    (the start token left out, as everywhere here), read in batches through the hooked forward."""
    layer = sae.config.layer
    fired = torch.zeros(sae.config.d_sae, dtype=torch.bool)
    tokens = 0
    for rows, _ in activations(model, seqs, [layer], batch):
        x = rows[layer].to(model.transformer.wte.weight.device)
        fired |= (sae.encode(x) > 0).any(0).cpu()
        tokens += x.size(0)
    return 1.0 - float(fired.float().mean()), tokens
