"""Inside a GPT at one position: the residual stream after every block, and every head's attention there.

What interpretability notebooks read with forward hooks (TransformerLens, nnsight), computed here by
running the model's own modules one by one in nanoGPT's order, so nothing is hooked and nothing of the
model changes:

    x_0 = wte(ids) + wpe(positions)                                  the residual stream after layer 0
    for each block l = 1..n_layer:
        a   = ln_1(x);  q, k, v = split(c_attn(a))                   heads of size hs = C / nh
        A   = softmax(q kᵀ / √hs, causal)                            attention weights, each row sums to 1
        y   = edit_heads(A v, l, edit)                               the heads' outputs (B, nh, T, hs), edited
        x   = x + c_proj(y);  x = x + edit_mlp(mlp(ln_2(x)), l, edit)  x_l
    logits = lm_head(ln_f(x_n))

Only the last position p is kept: x_0..x_n at p (the logit lens reads them through ln_f and lm_head, as
nostalgebraist's "logit lens" does), A's row p for every layer and head, and what each head and MLP
wrote there (y at p, the MLP's output at p: direct logit attribution splits the logit by them). Every
other row's attention runs through the same SDPA call as the model's forward; row p is worked out
explicitly (its softmax is the one shown, and the one its output is made from). An edit
(webapp/chat/model/edits.py) replaces heads' and MLPs' outputs through the same edit_heads and edit_mlp
as the model's own forwards.

Shapes: T tokens run, S = start + T positions attended (keys), C n_embd, nh heads, hs = C // nh, V vocab.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch.nn import functional as F

from webapp.chat.model.edits import Edit, edit_heads, edit_mlp

# The modules a model needs (nanoGPT's names): the owner's factory models have them or cannot be looked into.
MODEL_MODULES = ("transformer.wte", "transformer.wpe", "transformer.h", "transformer.ln_f", "lm_head")
BLOCK_MODULES = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp")


@dataclass
class Inside:
    residuals: torch.Tensor  # (n_layer + 1, C): x_0 (embeddings) .. x_n (after the last block), at position p
    attention: torch.Tensor  # (n_layer, nh, S) float32: position p's attention weights over positions 0..p
    heads: torch.Tensor  # (n_layer, nh, hs): each head's output at p (after the edit, before c_proj)
    mlps: torch.Tensor  # (n_layer, C): each MLP's output at p (after the edit, c_proj's bias included)


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


KeysValues = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (1, nh, >= start, hs)


def queries_keys_values(block: Any, x: torch.Tensor, nh: int, kv_dtype: torch.dtype | None,
                        past: tuple[torch.Tensor, torch.Tensor] | None, start: int) -> tuple[torch.Tensor, ...]:
    """A block's queries for the T positions run (1, nh, T, hs), and its keys and values over every position
    (1, nh, start + T, hs): the kept cache's first `start`, then those run here, rounded to kv_dtype as the
    cache would have held them."""
    T, C = x.size(1), x.size(2)
    q, k, v = block.attn.c_attn(block.ln_1(x)).split(C, dim=2)
    q, k, v = (t.view(1, T, nh, C // nh).transpose(1, 2) for t in (q, k, v))  # (1, nh, T, hs)
    if kv_dtype is not None:
        k, v = k.to(kv_dtype).to(q.dtype), v.to(kv_dtype).to(q.dtype)
    if past is not None:
        past_k, past_v = past
        k = torch.cat([past_k[:, :, :start].to(q.dtype), k], dim=2)
        v = torch.cat([past_v[:, :, :start].to(q.dtype), v], dim=2)
    return q, k, v


@torch.inference_mode()
def look_inside(model: Any, ids: torch.Tensor, start: int = 0, past: KeysValues | None = None,
                between: Callable[[], None] | None = None, edit: Edit | None = None) -> Inside:
    """Run ids (1, T) at positions start..start+T-1 and return what happened at the last one, p.

    past: the keys and values of positions 0..start-1, per layer (read, never written), e.g. a reply's
    kept KV cache (one run with the same edit); without it start must be 0. between: called after each
    block (the core lets running replies take a step there). edit: heads' and MLPs' outputs replaced."""
    if (start > 0) != (past is not None):
        raise ValueError("positions before `start` need their keys and values (past), and only they")
    config = model.config  # the owner's models: any object with n_embd and n_head
    C, nh = config.n_embd, config.n_head
    hs = C // nh
    T = ids.size(1)
    kv_dtype = getattr(model, "kv_dtype", None)  # the reply's KV cache kept keys and values in this dtype
    transformer = model.transformer
    positions = torch.arange(start, start + T, dtype=torch.long, device=ids.device)  # (T,)
    x = transformer.wte(ids) + transformer.wpe(positions)  # (1, T, C)
    residuals, attention, heads, mlps = [x[0, -1]], [], [], []
    blocks = list(transformer.h)
    for layer, block in enumerate(blocks):
        q, k, v = queries_keys_values(block, x, nh, kv_dtype, None if past is None else past[layer], start)
        last = layer == len(blocks) - 1  # the last block is needed at p alone
        # position p: scores over every position (all are before it, or it), the softmax kept
        scores = (q[:, :, -1:] @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (1, nh, 1, S)
        weights = torch.softmax(scores.float(), dim=-1)  # (1, nh, 1, S)
        attention.append(weights[0, :, 0])
        y = weights.to(v.dtype) @ v  # (1, nh, 1, hs)
        if T > 1 and not last:  # the other rows as the model's forward runs them
            mask = torch.ones(T - 1, start + T - 1, dtype=torch.bool, device=x.device).tril(diagonal=start)
            rest = F.scaled_dot_product_attention(q[:, :, :-1], k[:, :, :-1], v[:, :, :-1],
                                                  attn_mask=None if start == 0 else mask, is_causal=start == 0)
            y = torch.cat([rest, y], dim=2)  # (1, nh, T, hs)
        if last:
            x = x[:, -1:]
        first = start + T - x.size(1)  # the position of x's (and y's) first row
        y = edit_heads(y, layer, edit, first)  # (1, nh, x's T, hs)
        heads.append(y[0, :, -1])
        y = y.transpose(1, 2).contiguous().view(1, y.size(2), C)  # heads side by side
        x = x + block.attn.c_proj(y)
        out = edit_mlp(block.mlp(block.ln_2(x)), layer, edit, first)
        mlps.append(out[0, -1])
        x = x + out
        residuals.append(x[0, -1])
        if between is not None:
            between()
    return Inside(torch.stack(residuals), torch.stack(attention), torch.stack(heads), torch.stack(mlps))


@torch.inference_mode()
def lens_logits(model: Any, residuals: torch.Tensor) -> torch.Tensor:
    """The logit lens: each residual (L, C) through the final layer norm and lm_head -> logits (L, V)."""
    logits: torch.Tensor = model.lm_head(model.transformer.ln_f(residuals))
    return logits
