"""Training TopK dictionaries on a model's residual stream (Gao et al. 2024), one per chosen block, all on the
same activations: Adam at lr 2e-4 / √(d_sae / 2¹⁴) (Gao et al.'s) times the first buffer's mean norm over √d_in
(unscaled, a stream of large norm learned far slower: docs/features.md), the decoder's rows kept at unit norm (the
gradient's part along each row removed, then the rows renormalised), b_dec started at the first buffer's mean, and the
AuxK loss (k_aux = d_in / 2, weight 1/32) on the features that fired on none of the last DEAD_TOKENS tokens.
AuxK revives the features that never fire; the rare ones (a few times in a million tokens) it leaves, and a held-out
text of thousands of tokens finds them silent. So at RESAMPLE_AT of training, the features that fired on fewer than
`resample_below` of the tokens since the last look are started again on the inputs reconstructed worst (Bricken et
al. 2023's resampling, for TopK: resample()).

The first `eval_sequences` sequences of the corpus are held out for the quality figures
(webapp/chat/features/quality.py); training reads the ones after them. A checkpoint (the dictionaries in
SAELens's format, and `glassbox_training.pt`: the optimiser, the step, the sequences read) is written every
`checkpoint_seconds`, at the end, and on Ctrl-C; `resume` goes on from it.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from webapp.chat.features import saelens
from webapp.chat.features.activations import ShuffleBuffer, activations, corpus_files, documents, sequences
from webapp.chat.features.sae import Dictionary, DictionaryConfig, remove_parallel_gradient
from webapp.chat.features.topk_step import choose, losses

STATE = "glassbox_training.pt"
DEAD_TOKENS = 1_000_000  # a feature silent this long is dead (for AuxK and the figures)
AUX_WEIGHT = 1 / 32  # AuxK's weight in the loss (Gao et al.'s)
RESAMPLE_AT = (0.2, 0.4, 0.6)  # the fractions of training where the rare features start again


@dataclass(frozen=True)
class Plan:
    layers: tuple[int, ...]
    width: int
    k: int
    tokens: int  # training tokens (activation rows) per dictionary
    context: int = 128  # tokens per sequence
    batch: int = 4096  # activation rows per step
    sequences_per_forward: int = 16
    buffer_batches: int = 8  # the shuffle buffer holds this many steps' rows
    eval_sequences: int = 64
    seed: int = 0
    lr: float | None = None  # None: 2e-4 / sqrt(width / 2**14), times the activations' scale (learning_rate)
    checkpoint_seconds: float = 300.0
    resample_below: float = 0.0  # a feature's density (firings per token) under which it starts again; 0: never

    def learning_rate(self, mean_norm: float, d_in: int) -> float:
        """lr, else Gao et al.'s rate times the activations' mean norm over √d_in."""
        if self.lr is not None:
            return self.lr
        return 2e-4 / math.sqrt(self.width / 2**14) * max(mean_norm, 1e-6) / math.sqrt(d_in)


@dataclass
class Progress:
    step: int
    tokens: int
    tokens_per_second: float
    explained_variance: dict[int, float]  # per layer, on the last step's batch
    l0: dict[int, float]


def folder_of(out: Path, plan: Plan, layer: int) -> Path:
    """Where a dictionary is written: `out` itself for one block, out/blocks.L.hook_resid_post for several."""
    return out if len(plan.layers) == 1 else out / f"blocks.{layer}.hook_resid_post"


def train(model: Any, prompt: Any, corpus: Path, plan: Plan, out: Path, model_name: str = "",
          resume: bool = False, report: Callable[[Progress], None] | None = None,
          between: Callable[[], None] | None = None) -> dict[int, Dictionary]:
    """Train one dictionary per block of `plan.layers` on the corpus's activations, writing them into `out`.
    between: called after each step (a job on the core lets replies step, and stops there when cancelled)."""
    torch.manual_seed(plan.seed)
    d_in = model.config.n_embd
    device = model.transformer.wte.weight.device  # the dictionaries train where the model runs (rows come on the CPU)
    saes = {layer: Dictionary(DictionaryConfig(d_in, plan.width, "topk", plan.k, layer, model_name=model_name))
            for layer in plan.layers}
    saes = {layer: sae.to(device) for layer, sae in saes.items()}
    optimiser = new_optimiser(saes, plan.lr or 0.0)  # the rate is set from the first buffer (learning_rate)
    quiet = {layer: torch.zeros(plan.width, dtype=torch.long) for layer in plan.layers}  # tokens since it fired
    fired = {layer: torch.zeros(plan.width, dtype=torch.long) for layer in plan.layers}  # firings since the last look
    step, read, started = 0, 0, False
    state_path = out / STATE
    if resume and state_path.exists():
        state = torch.load(state_path, weights_only=False)
        for layer, sae in saes.items():
            sae.load_state_dict(saelens.load(folder_of(out, plan, layer)).to(device).state_dict())
        optimiser.load_state_dict(state["optimiser"])
        step, read, quiet, started = state["step"], state["sequences_read"], state["quiet"], True
        fired = state.get("fired", fired)
    seqs = sequences(documents(corpus_files(corpus), prompt), plan.context)
    counted = _Counted(itertools.islice(seqs, plan.eval_sequences + read, None), read)
    stream = activations(model, counted, plan.layers, plan.sequences_per_forward)
    buffers = {layer: ShuffleBuffer(plan.batch * plan.buffer_batches, d_in, plan.seed + layer) for layer in plan.layers}
    pending = {layer: torch.empty(0, d_in) for layer in plan.layers}  # rows read, not yet in the buffer
    clock, last_save, tokens_at_clock = time.monotonic(), time.monotonic(), step * plan.batch

    def save() -> None:
        for layer, sae in saes.items():
            saelens.save(sae, folder_of(out, plan, layer), {"plan": asdict(plan), "step": step,
                                                            "tokens": step * plan.batch})
        torch.save({"optimiser": optimiser.state_dict(), "step": step, "sequences_read": counted.read,
                    "quiet": quiet, "fired": fired, "plan": asdict(plan)}, state_path)

    try:
        while step * plan.batch < plan.tokens:
            if not _fill(buffers, pending, stream):
                break  # the corpus ran out
            if not started:
                first = {layer: buffers[layer].data[:buffers[layer].n] for layer in saes}
                for layer, sae in saes.items():  # b_dec at the first buffer's mean
                    with torch.no_grad():
                        sae.b_dec.copy_(first[layer].mean(0).to(device))
                for group, layer in zip(optimiser.param_groups, saes):  # each block's stream its own scale
                    group["lr"] = plan.learning_rate(float(first[layer].norm(dim=-1).mean()), d_in)
                started = True
            rows = {layer: buffers[layer].take(plan.batch).to(device) for layer in saes}
            figures = train_step(saes, rows, optimiser, quiet, fired)
            step += 1
            looks = {round(f * plan.tokens / plan.batch) for f in RESAMPLE_AT}
            if plan.resample_below > 0 and step in looks:
                since = step - max([s for s in looks if s < step], default=0)
                for index, (layer, sae) in enumerate(saes.items()):
                    rare = fired[layer] < plan.resample_below * since * plan.batch
                    resample(sae, rows[layer], rare.to(device), optimiser, optimiser.param_groups[index])
                    fired[layer].zero_()
            if between is not None:
                between()
            now = time.monotonic()
            if report is not None and (now - clock > 1.0 or step * plan.batch >= plan.tokens):
                rate = (step * plan.batch - tokens_at_clock) / max(now - clock, 1e-9)
                report(Progress(step, step * plan.batch, rate, {k: v[0] for k, v in figures.items()},
                                {k: v[1] for k, v in figures.items()}))
                clock, tokens_at_clock = now, step * plan.batch
            if now - last_save > plan.checkpoint_seconds:
                save()
                last_save = now
    finally:  # the end, Ctrl-C, a cancelled job: the last step kept
        if started:
            save()
    return saes


def _fill(buffers: dict[int, ShuffleBuffer], pending: dict[int, torch.Tensor],
          stream: Iterator[tuple[dict[int, torch.Tensor], int]]) -> bool:
    """Top every buffer up, from the rows read before first -> False when the corpus is spent and the buffers
    are empty."""
    while True:
        for layer, buffer in buffers.items():
            pending[layer] = buffer.add(pending[layer])
        if all(b.full() for b in buffers.values()):
            return True
        found = next(stream, None)
        if found is None:
            return all(b.n for b in buffers.values())
        for layer, rows in found[0].items():
            pending[layer] = torch.cat([pending[layer], rows])


def new_optimiser(saes: dict[int, Dictionary], lr: float) -> torch.optim.Adam:
    """Adam with one parameter group per dictionary, in the order of `saes` (each its own rate)."""
    groups = [{"params": [sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec]} for sae in saes.values()]
    return torch.optim.Adam(groups, lr=lr, betas=(0.9, 0.999), eps=6.25e-10)


def train_step(saes: dict[int, Dictionary], rows: dict[int, torch.Tensor], optimiser: torch.optim.Optimizer,
               quiet: dict[int, torch.Tensor], fired: dict[int, torch.Tensor] | None = None
               ) -> dict[int, tuple[float, float]]:
    """One step of every dictionary on its batch of activation rows (N, d_in), `quiet` (tokens since each feature
    fired) and `fired` (how often each fired) updated -> each one's (explained variance, L0) on the batch."""
    figures = {layer: _step(sae, rows[layer], quiet[layer], sae.config.d_in, None if fired is None else fired[layer])
               for layer, sae in saes.items()}
    for sae in saes.values():
        remove_parallel_gradient(sae)
    optimiser.step()
    optimiser.zero_grad(set_to_none=True)
    for sae in saes.values():
        sae.normalize_decoder()
    return figures


def _step(sae: Dictionary, x: torch.Tensor, quiet: torch.Tensor, d_in: int, counts: torch.Tensor | None
          ) -> tuple[float, float]:
    """One batch's losses backward (the optimiser steps for every dictionary at once) -> (explained variance, L0).
    The losses are worked out on the features each row uses (webapp/chat/features/topk_step.py)."""
    chosen = choose(sae, x)
    active = chosen[1].gather(-1, chosen[2]) > 0  # (N, k): a row's chosen features that fire
    fires = torch.bincount(chosen[2][active], minlength=sae.config.d_sae).cpu()
    quiet += x.size(0)
    quiet[fires > 0] = 0
    if counts is not None:
        counts += fires
    dead = (quiet > DEAD_TOKENS).to(x.device)
    loss, error = losses(sae, x, chosen, dead, d_in // 2, AUX_WEIGHT)
    loss.backward()  # type: ignore[no-untyped-call]
    total = ((x - x.mean(0)) ** 2).sum()
    return 1.0 - float(error.sum() / total.clamp_min(1e-8)), float(active.sum(-1).float().mean())


@torch.no_grad()
def resample(sae: Dictionary, x: torch.Tensor, rare: torch.Tensor, optimiser: torch.optim.Optimizer,
             group: dict[str, Any]) -> int:
    """Start the `rare` features (d_sae,) again, each on a row of the batch x (N, d_in) drawn with probability
    ∝ its squared reconstruction error: its decoder row that row's direction from b_dec, its encoder column the
    same at the live features' mean encoder norm (so it wins its TopK on inputs like it), b_enc 0, and its Adam
    moments cleared -> how many started again."""
    features = rare.nonzero().squeeze(-1)
    n = int(features.numel())
    if n == 0 or n == rare.numel():
        return 0
    error = ((sae.decode(sae.encode(x)) - x) ** 2).sum(-1)
    picked = torch.multinomial(error.pow(2) + 1e-12, n, replacement=n > x.size(0))
    directions = x[picked] - sae.b_dec
    directions /= directions.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    scale = sae.W_enc[:, ~rare].norm(dim=0).mean()
    sae.W_dec[features] = directions
    sae.W_enc[:, features] = directions.T * scale
    sae.b_enc[features] = 0.0
    for parameter in group["params"]:
        state = optimiser.state.get(parameter, {})
        for moment in ("exp_avg", "exp_avg_sq"):
            if moment in state:
                if parameter is sae.W_enc:
                    state[moment][:, features] = 0.0
                elif parameter is sae.W_dec or parameter is sae.b_enc:
                    state[moment][features] = 0.0
    return n


class _Counted:
    """An iterator of sequences that counts how many were read (a resumed run skips them)."""

    def __init__(self, inner: Iterator[list[int]], read: int) -> None:
        self.inner, self.read = inner, read

    def __iter__(self) -> _Counted:
        return self

    def __next__(self) -> list[int]:
        item = next(self.inner)
        self.read += 1
        return item
