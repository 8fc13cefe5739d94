"""The logit lens over a whole reply: every layer's residual at every position that produced a reply token,
read out through the final layer norm and the output layer.

One forward of the prompt and the reply, through the model's own modules in nanoGPT's order (as
webapp/chat/model/inside.py, nothing hooked), keeping the residual stream at the reply's positions (the
prompt's first positions may come as a kept KV cache's keys and values instead, as Inside's do):

    x_0 = wte(ids) + wpe(positions)                                    after the embeddings
    for each block l = 1..n_layer:
        y = edit_heads(softmax(q kᵀ / √hs, causal) v, l, edit)        (1, nh, T, hs)
        x = x + c_proj(y);  x = x + edit_mlp(mlp(ln_2(x)), l, edit)   x_l
    logits_l = lm_head(ln_f(x_l))                                       at each kept position

Only the top-1 token, its probability and the written token's probability and rank are kept from the
logits (softmax at temperature 1 over the whole output layer, as the token panel's odds): the output layer
is run on a few rows at a time, so a large vocabulary never needs (n_layer + 1) × T × V floats at once.

Shapes: T tokens run, R reply positions kept, L = n_layer + 1 layers, C n_embd, V the output layer's rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from webapp.chat.model.edits import Edit, edit_heads, edit_mlp
from webapp.chat.model.inside import KeysValues, queries_keys_values

LOGIT_FLOATS = 2**23  # logits worked out at once (32 MiB of float32): rows of the output layer per chunk


@dataclass
class LensGrid:
    """(L, R) each: layer l's most likely token at reply position r, its probability, and the written token's
    probability and rank there (1: the layer's most likely)."""

    top: torch.Tensor  # long
    top_p: torch.Tensor  # float32
    written_p: torch.Tensor  # float32
    written_rank: torch.Tensor  # long


@torch.inference_mode()
def reply_residuals(model: Any, ids: torch.Tensor, first: int, between: Callable[[], None] | None = None,
                    edit: Edit | None = None, start: int = 0, past: KeysValues | None = None) -> torch.Tensor:
    """Run ids (1, T) at positions start..start+T-1 -> the residual stream at positions first.. after the
    embeddings and after each block, (L, start + T - first, C). between: called after each block; edit:
    heads' and MLPs' outputs replaced as in every forward of the model (webapp/chat/model/edits.py); past:
    the keys and values of positions 0..start-1 per layer (read, never written), e.g. a reply's kept KV cache
    (a run with the same edit); without it start must be 0. first >= start."""
    if (start > 0) != (past is not None) or first < start:
        raise ValueError("positions before `start` need their keys and values (past), and only they; first >= start")
    config = model.config
    C, nh = config.n_embd, config.n_head
    T = ids.size(1)
    kv_dtype = getattr(model, "kv_dtype", None)  # the reply's KV cache kept keys and values in this dtype
    transformer = model.transformer
    positions = torch.arange(start, start + T, dtype=torch.long, device=ids.device)  # (T,)
    x = transformer.wte(ids) + transformer.wpe(positions)  # (1, T, C)
    # row i (position start + i) sees keys 0..start + i
    mask = None if past is None else torch.ones(T, start + T, dtype=torch.bool, device=ids.device).tril(start)
    kept = [x[0, first - start:]]
    for layer, block in enumerate(transformer.h):
        q, k, v = queries_keys_values(block, x, nh, kv_dtype, None if past is None else past[layer], start)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)  # (1, nh, T, hs)
        y = edit_heads(y, layer, edit, start)
        x = x + block.attn.c_proj(y.transpose(1, 2).contiguous().view(1, T, C))
        x = x + edit_mlp(block.mlp(block.ln_2(x)), layer, edit, start)
        kept.append(x[0, first - start:])
        if between is not None:
            between()
    return torch.stack(kept)


@torch.inference_mode()
def lens_grid(model: Any, residuals: torch.Tensor, written: torch.Tensor,
              between: Callable[[], None] | None = None, logit_floats: int = LOGIT_FLOATS) -> LensGrid:
    """residuals (L, R, C) and the written token at each position, written (R,) -> the grid. The output
    layer runs on at most `logit_floats` logits at a time; between: called after each such chunk."""
    L, R, C = residuals.shape
    flat = residuals.reshape(L * R, C)  # layer-major: row l * R + r
    wanted = written.to(flat.device).repeat(L).view(L * R, 1)  # the written token of each row
    V = model.lm_head.weight.size(0)
    rows = max(1, logit_floats // V)
    top, top_p, written_p, written_rank = [], [], [], []
    for start in range(0, L * R, rows):
        logits = model.lm_head(model.transformer.ln_f(flat[start:start + rows])).float()  # (rows, V)
        logz = torch.logsumexp(logits, dim=-1)  # (rows,)
        best, best_id = logits.max(dim=-1)
        mine = logits.gather(-1, wanted[start:start + rows])  # (rows, 1)
        top.append(best_id)
        top_p.append(torch.exp(best - logz))
        written_p.append(torch.exp(mine[:, 0] - logz))
        written_rank.append((logits > mine).sum(-1) + 1)  # ranked as odds.py ranks: strictly greater logits
        if between is not None:
            between()
    return LensGrid(*(torch.cat(parts).view(L, R).cpu() for parts in (top, top_p, written_p, written_rank)))
