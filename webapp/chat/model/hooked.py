"""One forward for every experiment: the model's own modules in nanoGPT's order, with read and edit hooks.

Inside, the logit lens, attribution, ablation, activation patching and the one-head view all run the model
through run() and read what they need from its Readout; the model's own forward (GPT.forward) is run() too.
Only the serving paths (GPT.prefill, GPT.decode_step and the C kernel) loop over the blocks elsewhere, and
they honour the same edits (webapp/chat/model/edits.py). The hook points, named as TransformerLens and
SAELens name them (block l counted from 0):

    x = wte(ids) + wpe(positions)                         hook_embed: resid[0], the stream entering block 0
    for each block l:
        q, k, v = split(c_attn(ln_1(x)))                  keys_values[l]: k, v as a kept KV cache holds them
        A = softmax(q kᵀ / √hs, causal)                   blocks.l.attn.hook_pattern: pattern[l]
        z = edit_heads(A v, l, edit)                      blocks.l.attn.hook_z: z[l], each head's output
        x = x + c_proj(merge(z))
        m = edit_mlp(mlp(ln_2(x)), l, edit)               blocks.l.hook_mlp_out: mlp_out[l]
        x = edit_resid(x + m, l, edit)                    blocks.l.hook_resid_post: resid[l + 1]

Reads are kept at the positions asked for only (Reads.first on), for the layers asked for only; the
attention pattern is worked out only where it is read (the output itself always comes from attend()).

A run may start from a kept KV cache (past: positions 0..start-1, read, never written) and from any layer
(x: the stream entering it, as activation patching's patched runs do), may stop after any layer (the
one-head view), and may run its last block at its last position alone (`last_only`: what a metric at
that position needs). Each row of a batch has its own edit. Nothing here takes gradients off or on: the
model's training forward runs it with autograd, the experiments under torch.inference_mode.

Shapes: B rows, T positions run, S = start + T positions attended, P positions kept, C n_embd,
nh heads, hs = C // nh.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from webapp.chat.model.attention import attend, merge_heads, split_heads
from webapp.chat.model.attention import pattern as attention_pattern
from webapp.chat.model.edits import Edit, edit_heads, edit_mlp, edit_resid

KeysValues = list[tuple[Tensor, Tensor]]  # per layer: keys, values (1 or B, nh, >= start, hs)

# The modules a model needs (nanoGPT's names): the owner's factory models have them or cannot be looked into.
MODEL_MODULES = ("transformer.wte", "transformer.wpe", "transformer.h", "transformer.ln_f", "lm_head")
BLOCK_MODULES = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp")




@dataclass(frozen=True)
class Reads:
    """What a run keeps: each hook point asked for, at positions `first`.. (absolute; None: every position
    run) of the layers in `layers` (None: every layer). resid[l] is the stream entering block l, and
    resid[n_layer] the final one (before ln_f): resid[l + 1] is blocks.l.hook_resid_post."""

    resid: bool = False
    z: bool = False
    mlp_out: bool = False
    pattern: bool = False  # float32 softmax of the kept query rows over every key
    keys_values: bool = False  # every position run, whatever `first` says: a KV cache's contents
    first: int | None = None
    layers: frozenset[int] | None = None

    def at(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers


NOTHING = Reads()
EditPoint = Callable[[Tensor, int, "Edit | None", int], Tensor]  # edit_heads, edit_mlp, edit_resid


@dataclass
class Readout:
    """What a run kept, by layer (0-based blocks; resid also has n_layer, the final stream)."""

    x: Tensor  # (B, T or 1, C): the stream after the last block run (before ln_f)
    resid: dict[int, Tensor] = field(default_factory=dict)  # (B, P, C)
    z: dict[int, Tensor] = field(default_factory=dict)  # (B, nh, P, hs)
    mlp_out: dict[int, Tensor] = field(default_factory=dict)  # (B, P, C)
    pattern: dict[int, Tensor] = field(default_factory=dict)  # (B, nh, P, S) float32
    keys_values: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)  # (B, nh, T, hs) each

    def stacked(self, name: str) -> Tensor:
        """One read over its layers in order, stacked: (layers, ...)."""
        kept: dict[int, Tensor] = getattr(self, name)
        return torch.stack([kept[layer] for layer in sorted(kept)])


def layout_problem(model: Any) -> str | None:
    """Why this model cannot be looked into (None: it can): it must have nanoGPT's modules and n_head."""
    missing = [name for name in MODEL_MODULES if not _has(model, name)]
    if not missing:
        blocks = model.get_submodule("transformer.h")
        missing = [f"transformer.h.{i}.{name}" for i, block in enumerate(blocks) for name in BLOCK_MODULES
                   if not _has(block, name)][:3]
    if missing:
        return f"it does not have nanoGPT's module layout (no {', '.join(missing)})"
    config = getattr(model, "config", None)
    n_head, n_embd = getattr(config, "n_head", None), getattr(config, "n_embd", None)
    if not isinstance(n_head, int) or not isinstance(n_embd, int) or n_head < 1 or n_embd % n_head:
        return "its config does not give n_head and n_embd (n_embd a multiple of n_head)"
    return None


def _has(module: nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
        return True
    except AttributeError:
        return False


def embed(model: Any, ids: Tensor, start: int = 0) -> Tensor:
    """ids (B, T) at positions start..start+T-1 -> the stream entering block 0, wte(ids) + wpe(positions)."""
    T = ids.size(1)
    positions = torch.arange(start, start + T, dtype=torch.long, device=ids.device)  # (T,)
    x: Tensor = model.transformer.wte(ids) + model.transformer.wpe(positions)  # (B, T, C)
    return x


def run(model: Any, x: Tensor, *, start: int = 0, past: KeysValues | None = None, first_layer: int = 0,
        last_layer: int | None = None, edits: Sequence[Edit | None] | Edit | None = None,
        reads: Reads = NOTHING, last_only: bool = False, between: Callable[[], None] | None = None) -> Readout:
    """x (B, T, C): the stream entering block `first_layer` at positions start..start+T-1 -> the blocks
    first_layer..last_layer run (every later block without last_layer), with each row's edit (one Edit:
    every row's), keeping what `reads` asks for.

    past: the keys and values of positions 0..start-1 per layer (one sequence's: every row shares them);
    without it start must be 0. last_only: the last block runs its last position alone. between: called
    after each block (the core lets running replies take a step there)."""
    if (start > 0) != (past is not None):
        raise ValueError("positions before `start` need their keys and values (past), and only they")
    blocks = model.transformer.h
    last_layer = len(blocks) - 1 if last_layer is None else last_layer
    if not 0 <= first_layer <= last_layer < len(blocks):
        raise ValueError(f"no blocks {first_layer}..{last_layer}: the model has {len(blocks)}")
    B, T = x.size(0), x.size(1)
    row_edits = list(edits) if isinstance(edits, Sequence) else [edits] * B
    if len(row_edits) != B:
        raise ValueError(f"{B} rows and {len(row_edits)} edits: one each")
    kv_dtype = getattr(model, "kv_dtype", None)  # a kept KV cache holds keys and values in this dtype
    nh = model.config.n_head
    out = Readout(x)
    first = start if reads.first is None else reads.first
    _keep(out.resid, first_layer, x, start + T, first, reads.resid and reads.at(first_layer))
    for layer in range(first_layer, last_layer + 1):
        block = blocks[layer]
        q, k, v = split_heads(block.attn.c_attn(block.ln_1(x)), nh)  # (B, nh, x's T, hs) each
        if kv_dtype is not None:  # what the cache would have held
            k, v = k.to(kv_dtype).to(q.dtype), v.to(kv_dtype).to(q.dtype)
        wanted = reads.at(layer)
        if reads.keys_values and wanted:
            out.keys_values[layer] = (k, v)
        if past is not None:
            past_k, past_v = past[layer]
            k = torch.cat([past_k[:, :, :start].to(q.dtype).expand(B, -1, -1, -1), k], dim=2)  # (B, nh, S, hs)
            v = torch.cat([past_v[:, :, :start].to(q.dtype).expand(B, -1, -1, -1), v], dim=2)
        if last_only and layer == last_layer:  # only the last position's output is wanted: it sees every key
            q, x = q[:, :, -1:], x[:, -1:]
        at = start + T - x.size(1)  # the position of x's first row
        S = start + T
        if reads.pattern and wanted:
            rows = q[:, :, max(first - at, 0):]
            out.pattern[layer] = attention_pattern(rows, k)  # (B, nh, P, S)
        z = _per_row(edit_heads, attend(q, k, v), layer, row_edits, at)  # (B, nh, T', hs)
        _keep(out.z, layer, z, S, first, reads.z and wanted, dim=2)
        x = x + block.attn.c_proj(merge_heads(z))
        m = _per_row(edit_mlp, block.mlp(block.ln_2(x)), layer, row_edits, at)
        _keep(out.mlp_out, layer, m, S, first, reads.mlp_out and wanted)
        x = _per_row(edit_resid, x + m, layer, row_edits, at)
        _keep(out.resid, layer + 1, x, S, first, reads.resid and reads.at(layer + 1))
        if between is not None:
            between()
    out.x = x
    return out


def _per_row(apply: EditPoint, t: Tensor, layer: int, edits: list[Edit | None], start: int) -> Tensor:
    """Each row of t (positions start..) through an edit point of edits.py with its own edit (t itself when
    no row has one)."""
    if all(e is None for e in edits):
        return t
    if all(e is edits[0] for e in edits):  # one edit for every row (a batch of one sequence)
        return apply(t, layer, edits[0], start)
    return torch.cat([apply(t[r:r + 1], layer, e, start) for r, e in enumerate(edits)])


def _keep(into: dict[int, Tensor], layer: int, t: Tensor, end: int, first: int, wanted: bool, dim: int = 1) -> None:
    """Keep t's rows at positions first..end-1 (t holds the last t.size(dim) positions before end)."""
    if wanted:
        skip = max(first - (end - t.size(dim)), 0)
        # t itself when every position is kept: the tensor the run goes on with, so a run with gradients on
        # can take them with respect to what it read (attribution patching)
        into[layer] = t if skip == 0 else t.narrow(dim, skip, t.size(dim) - skip)
