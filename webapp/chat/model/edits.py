"""Edits of a run: a head's output, or an MLP's, replaced on its way into the residual stream.

Every head's output passes one place, edit_heads(), between attention and the merge of the heads into
c_proj; every MLP's output passes edit_mlp(), before its residual add. Every way the model runs goes
through them (webapp/chat/model/gpt.py: forward, prefill, the decode step's per-layer path;
webapp/chat/model/inside.py), so an edit means the same thing wherever it runs:

    y = softmax(q kᵀ / √hs) v             (B, nh, T, hs): each head's output at positions start..start+T-1
    y = edit_heads(y, layer, edit, start)
    x = x + c_proj(merge_heads(y))
    x = x + edit_mlp(mlp(ln_2(x)), layer, edit, start)

A replacement is zero (zero ablation), one vector for every position (mean ablation: a head's mean
output), or one vector per position 0..P-1 of the sequence (activation patching: another run's outputs,
read by absolute position, so a prompt prefilled in chunks and then decoded gets the same ones).

An edit is per row (per sequence): None means no edit, and a run without one is the model's own, bit for
bit. A decode-step row with an edit leaves the fused block kernel for the per-layer path; the other rows
stay on it (GPT.decode_step).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass(frozen=True, eq=False)  # eq=False: no == over tensors (Edit.key compares what edits do)
class HeadEdit:
    """Replace head `head` of layer `layer` (0-based blocks): its output (before c_proj) becomes `value`."""

    layer: int
    head: int
    value: torch.Tensor | None = None  # None: zero; (hs,): at every position; (P, hs): at each position < P


@dataclass(frozen=True, eq=False)
class MlpEdit:
    """Replace the MLP output of layer `layer` (before its residual add) with `value`."""

    layer: int
    value: torch.Tensor | None = None  # None: zero; (C,): at every position; (P, C): at each position < P


@dataclass(frozen=True, eq=False)
class Edit:
    """What one run (one sequence) has replaced: some heads' outputs and some MLPs' outputs. The values
    are read as given, on every forward; its `key` is taken once, so they must not change afterwards."""

    heads: tuple[HeadEdit, ...] = ()
    mlps: tuple[MlpEdit, ...] = ()

    def heads_at(self, layer: int) -> tuple[HeadEdit, ...]:
        return tuple(h for h in self.heads if h.layer == layer)

    def mlps_at(self, layer: int) -> tuple[MlpEdit, ...]:
        return tuple(m for m in self.mlps if m.layer == layer)

    @cached_property
    def key(self) -> str:
        """A stable name of what this edit does (its layers, heads and values' bits): runs with equal keys
        compute the same keys and values, so they may share a prefix cache's entries (its `variant`)."""
        digest = hashlib.sha256()
        items: tuple[HeadEdit | MlpEdit, ...] = (*self.heads, *self.mlps)
        for item in items:
            where = f"head:{item.layer}:{item.head}" if isinstance(item, HeadEdit) else f"mlp:{item.layer}"
            digest.update(where.encode())
            if item.value is None:
                digest.update(b"=zero;")
                continue
            value = item.value.detach().to("cpu").contiguous()
            digest.update(f"={value.dtype}{tuple(value.shape)}:".encode())
            digest.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
            digest.update(b";")
        return digest.hexdigest()[:16]


def variant(edit: Edit | None) -> str | None:
    """The prefix cache's variant of a run with this edit: None for the model's own run."""
    return None if edit is None else edit.key


def _replacement(value: torch.Tensor | None, start: int, T: int) -> torch.Tensor | float:
    """What replaces an output at positions start..start+T-1: broadcastable to (T, size)."""
    if value is None:
        return 0.0
    if value.dim() == 1:
        return value
    if start + T > value.size(0):
        raise ValueError(f"the edit gives values for {value.size(0)} positions; asked for {start + T}")
    return value[start:start + T]


def edit_heads(y: torch.Tensor, layer: int, edit: Edit | None, start: int = 0) -> torch.Tensor:
    """y (B, nh, T, hs): layer `layer`'s heads' outputs at positions start..start+T-1 of one sequence (B rows
    of it: one in every caller but training) -> y with the edit's heads of this layer replaced (y itself,
    untouched, when there are none)."""
    heads = edit.heads_at(layer) if edit is not None else ()
    if not heads:
        return y
    y = y.clone()
    T = y.size(2)
    for h in heads:
        y[:, h.head] = _replacement(h.value, start, T)  # (B, T, hs)
    return y


def edit_mlp(out: torch.Tensor, layer: int, edit: Edit | None, start: int = 0) -> torch.Tensor:
    """out (B, T, C): layer `layer`'s MLP output at positions start..start+T-1 -> out with the edit's
    replacement (out itself when the edit has none for this layer)."""
    mlps = edit.mlps_at(layer) if edit is not None else ()
    if not mlps:
        return out
    out = out.clone()
    for m in mlps:
        out[:] = _replacement(m.value, start, out.size(1))
    return out
