"""Edits of a run: a head's output, or an MLP's, replaced on its way into the residual stream, and a vector
added to the residual stream after a block (steering).

Every head's output passes one place, edit_heads(), between attention and the merge of the heads into
c_proj; every MLP's output passes edit_mlp(), before its residual add; the stream after each block passes
edit_resid(). Every way the model runs goes through them (webapp/chat/model/hooked.py, the one forward
every experiment reads; webapp/chat/model/gpt.py: prefill and the decode step), so an edit means the same
thing wherever it runs:

    y = softmax(q kᵀ / √hs) v             (B, nh, T, hs): each head's output at positions start..start+T-1
    y = edit_heads(y, layer, edit, start)
    x = x + c_proj(merge_heads(y))
    x = x + edit_mlp(mlp(ln_2(x)), layer, edit, start)
    x = edit_resid(x, layer, edit, start)    x + each added vector, clamped features set: hook_resid_post

A replacement is zero (zero ablation), one vector for every position (mean ablation: a head's mean
output), or one vector per position 0..P-1 of the sequence (activation patching: another run's outputs,
read by absolute position, so a prompt prefilled in chunks and then decoded gets the same ones). An added
vector is one vector for every position (a steering direction times its strength) or one per position.

An edit is per row (per sequence): None means no edit, and a run without one is the model's own, bit for
bit. A decode-step row whose edit replaces outputs leaves the fused block kernel for the per-layer path;
the other rows stay on it, and so does a row whose edit only adds after blocks (the add follows the
kernel's call: GPT.decode_step).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
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
class ResidAdd:
    """Add `value` to the residual stream after block `layer` (0-based), at every position run: what a
    steering direction does (llama.cpp's control vector `direction.{layer}`)."""

    layer: int
    value: torch.Tensor  # (C,): at every position; (P, C): at each position < P


@dataclass(frozen=True, eq=False)
class ResidClamp:
    """Set one sparse-dictionary feature's activation after block `layer` to `value` at every position, keeping
    the dictionary's reconstruction error (Templeton et al. 2024): x ← x + (value − a(x)) · direction."""

    layer: int
    direction: torch.Tensor  # (C,): the feature's decoder row
    value: float
    activation: Callable[[torch.Tensor], torch.Tensor]  # x (N, C) -> (N,): the feature's activation there
    name: str  # the dictionary and the feature, for `key` (a function has no bits to hash)


@dataclass(frozen=True, eq=False)
class Edit:
    """What one run (one sequence) has changed: some heads' outputs and some MLPs' outputs replaced, some
    vectors added after blocks. The values are read as given, on every forward; its `key` is taken once, so
    they must not change afterwards."""

    heads: tuple[HeadEdit, ...] = ()
    mlps: tuple[MlpEdit, ...] = ()
    adds: tuple[ResidAdd, ...] = ()
    clamps: tuple[ResidClamp, ...] = ()

    def heads_at(self, layer: int) -> tuple[HeadEdit, ...]:
        return tuple(h for h in self.heads if h.layer == layer)

    def mlps_at(self, layer: int) -> tuple[MlpEdit, ...]:
        return tuple(m for m in self.mlps if m.layer == layer)

    def adds_at(self, layer: int) -> tuple[ResidAdd, ...]:
        return self._adds_by_layer.get(layer, ())

    def changes_stream_at(self, layer: int) -> bool:
        """Whether the edit adds to, or clamps a feature of, the stream after block `layer`."""
        return bool(self.adds_at(layer)) or any(c.layer == layer for c in self.clamps)

    @cached_property
    def _adds_by_layer(self) -> dict[int, tuple[ResidAdd, ...]]:
        """The added vectors by block, found once (a decode step asks at every block of every step)."""
        found: dict[int, tuple[ResidAdd, ...]] = {}
        for a in self.adds:
            found[a.layer] = (*found.get(a.layer, ()), a)
        return found

    @property
    def replaces(self) -> bool:
        """Whether the edit replaces any head's or MLP's output (not only adds after blocks)."""
        return bool(self.heads or self.mlps)

    @cached_property
    def key(self) -> str:
        """A stable name of what this edit does (its layers, heads and values' bits): runs with equal keys
        compute the same keys and values, so they may share a prefix cache's entries (its `variant`)."""
        digest = hashlib.sha256()
        items: tuple[HeadEdit | MlpEdit | ResidAdd, ...] = (*self.heads, *self.mlps, *self.adds)
        for clamp in self.clamps:  # the dictionary's feature by name, its target and its decoder row's bits
            digest.update(f"clamp:{clamp.layer}:{clamp.name}={clamp.value!r}:".encode())
            digest.update(clamp.direction.detach().to("cpu").float().contiguous().numpy().tobytes())
        for item in items:
            where = (f"head:{item.layer}:{item.head}" if isinstance(item, HeadEdit)
                     else f"add:{item.layer}" if isinstance(item, ResidAdd) else f"mlp:{item.layer}")
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


def edit_resid(x: torch.Tensor, layer: int, edit: Edit | None, start: int = 0) -> torch.Tensor:
    """x (B, T, C): the residual stream after block `layer` at positions start..start+T-1 -> x plus the
    edit's vectors added there, then its clamped features set, in x's dtype (x itself when the edit changes
    nothing after this block)."""
    if edit is None or not edit.changes_stream_at(layer):
        return x
    for a in edit.adds_at(layer):
        value = _replacement(a.value, start, x.size(1))
        assert isinstance(value, torch.Tensor)  # an added vector is never None
        x = x + (value if value.dtype == x.dtype else value.to(x.dtype))
    for clamp in (c for c in edit.clamps if c.layer == layer):
        now = clamp.activation(x.reshape(-1, x.size(-1)).float()).view(*x.shape[:-1], 1)  # (B, T, 1)
        x = x + ((clamp.value - now) * clamp.direction.float()).to(x.dtype)
    return x
