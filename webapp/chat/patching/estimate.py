"""Attribution patching (Nanda 2023; Syed, Rager & Conmy 2023): every cell of an activation-patching map
estimated to first order, from the clean run, one forward of the corrupted run with gradients and one
backward pass.

Patching a cell replaces an activation a of the corrupted run by the clean run's a'. To first order in the
difference the metric then moves by (a' - a) · ∂metric/∂a, the gradient taken on the corrupted run, so one
forward of it with gradients and one backward pass give every cell at once (the activations a and the
corrupted metric read from that forward: the same numbers as the exact map's corrupted run but for the
rounding of autograd's matmuls, and it needs none of that run, so the estimate comes before it):

    residual cell (l, p):  (resid'[l, p] - resid[l, p]) · g_resid[l, p]             (C,) · (C,)
    head cell (l, h):      Σ_p (z'[l, h, p] - z[l, h, p]) · g_z[l, h, p]            over positions p >= f

each normalised as an exact cell is, by clean - corrupted (webapp/chat/patching/compute.py). Positions
before f, the first difference, read the same tokens in both runs: their differences are 0, so the
corrupted run is taken from f on, on the clean run's keys and values before f (constants here).

The estimate is exact where the metric is linear in the activation and drifts where attention and the
layer norms bend it; the page shows each exact cell's error beside it. The backward pass goes a block at
a time (torch.autograd.grad from one block's output to its input), so running replies step between blocks
on the way down as on the way up; they step under inference_mode, as they always do.

Shapes: T positions, f the first difference, C n_embd, nh n_head, hs = C // nh, L n_layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from webapp.chat.model import hooked
from webapp.chat.patching.compute import Patching, Trace, edited_from, trace


def estimate(model: Any, clean_ids: Sequence[int], corrupted_ids: Sequence[int], chosen: int, against: int,
             clean: Trace | None = None, between: Callable[[], None] | None = None) -> Patching:
    """The whole map to first order: the clean run (`clean`, its trace kept by the caller, or run here), one
    forward of the corrupted run with gradients (positions f..T-1, its activations read from that same run)
    and one backward pass. Raises ValueError as compute.plan does (different lengths, the same contexts)."""
    f = edited_from(clean_ids, corrupted_ids)
    if clean is None:
        with torch.inference_mode():
            clean = trace(model, list(clean_ids), chosen, against, between=between)
    L = model.config.n_layer
    between = _outside_autograd(between)
    device = next(model.parameters()).device
    with torch.inference_mode(False), torch.enable_grad():
        # the clean trace was made under inference_mode, whose tensors autograd may not save: copies
        past = [(k.clone(), v.clone()) for k, v in clean.keys_values] if f > 0 else None
        ids = torch.tensor([list(corrupted_ids[f:])], dtype=torch.long, device=device)  # (1, T - f)
        x = hooked.embed(model, ids, f).detach().requires_grad_()  # (1, T - f, C): resid[0], a leaf
        out = hooked.run(model, x, start=f, past=past, reads=hooked.Reads(resid=True, z=True), between=between)
        logits = model.lm_head(model.transformer.ln_f(out.x[:, -1])).float()  # (1, V)
        metric = logits[0, chosen] - logits[0, against]
        moves_resid: list[Tensor] = [torch.empty(0)] * (L + 1)  # per layer (T - f,): each residual cell's move
        moves_heads: list[Tensor] = [torch.empty(0)] * L  # per block (nh,)
        (g,) = torch.autograd.grad(metric, [out.resid[L]])
        moves_resid[L] = _moves(clean.residuals[L, f:], out.resid[L][0], g[0], "tc,tc->t")
        for layer in range(L - 1, -1, -1):  # block `layer` backwards: resid[layer + 1] -> resid[layer], z[layer]
            g, gz = torch.autograd.grad(out.resid[layer + 1], [out.resid[layer], out.z[layer]], grad_outputs=g)
            moves_resid[layer] = _moves(clean.residuals[layer, f:], out.resid[layer][0], g[0], "tc,tc->t")
            moves_heads[layer] = _moves(clean.heads[layer, :, f:], out.z[layer][0], gz[0], "htd,htd->h")
            if between is not None:
                between()
    corrupted = float(metric.detach())
    span = clean.metric - corrupted

    def share(move: float) -> float | None:
        return None if span == 0 else move / span

    before: list[float | None] = [0.0] * f  # no difference before the edit, no move
    return Patching(clean.metric, corrupted, [before + [share(m) for m in row.tolist()] for row in moves_resid],
                    [[share(m) for m in row.tolist()] for row in moves_heads], f, is_estimate=True)


def _moves(clean: Tensor, corrupted: Tensor, grad: Tensor, dot: str) -> Tensor:
    """(a' - a) · ∂metric/∂a summed as `dot` says (over the features; for heads, positions too), in float32,
    a layer at a time as its gradient arrives (no (L, T, C) temporaries)."""
    with torch.no_grad():
        return torch.einsum(dot, (clean - corrupted.detach()).float(), grad.float())


def _outside_autograd(between: Callable[[], None] | None) -> Callable[[], None] | None:
    """Running replies (and a whole job run beside this one) step where a whole job lets them, here inside a
    region with gradients on: what runs there sets its own mode (decoding under inference_mode), and this
    makes sure of it for anything that does not, so nothing there builds a graph or leaves the kernels."""
    if between is None:
        return None
    step = between

    def paused() -> None:
        with torch.inference_mode():
            step()

    return paused
