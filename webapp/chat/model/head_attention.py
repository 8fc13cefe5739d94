"""One head's attention matrix: the weights of many query positions over every key position, for one block
and head, from the model's own modules run in nanoGPT's order (as webapp/chat/model/inside.py runs them):

    x = wte(ids) + wpe(positions)
    for each block before the chosen one:  the model's block, attention through the same SDPA call
    at the chosen block:  q, k = split(c_attn(ln_1(x)));  A = softmax(q kᵀ / √hs, causal)  for head h alone

Only the rows asked for are worked out, and nothing after the chosen block runs. The run is the model's
own, unedited, as Inside's is.

Shapes: T tokens run, S = start + T positions attended (keys), R = start + T - first query rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from webapp.chat.model.inside import KeysValues, queries_keys_values


@torch.inference_mode()
def head_attention(model: Any, ids: torch.Tensor, layer: int, head: int, first: int, start: int = 0,
                   past: KeysValues | None = None, between: Callable[[], None] | None = None) -> torch.Tensor:
    """Run ids (1, T) at positions start..start+T-1 through blocks 0..layer (0-based) -> (R, S) float32:
    head `head`'s attention weights of the query positions first..start+T-1 over positions 0..start+T-1
    (each row sums to 1; zero after the query, causal). past: keys and values of positions 0..start-1 per
    layer (read, never written); start <= first. between: called after each block run whole."""
    if (start > 0) != (past is not None):
        raise ValueError("positions before `start` need their keys and values (past), and only they")
    config = model.config
    C, nh = config.n_embd, config.n_head
    hs = C // nh
    T = ids.size(1)
    S = start + T
    if not start <= first < S:
        raise ValueError(f"query rows must start within the positions run ({start}..{S - 1}), not at {first}")
    kv_dtype = getattr(model, "kv_dtype", None)  # a reply's KV cache kept keys and values in this dtype
    transformer = model.transformer
    positions = torch.arange(start, S, dtype=torch.long, device=ids.device)  # (T,)
    x = transformer.wte(ids) + transformer.wpe(positions)  # (1, T, C)
    for n, block in enumerate(transformer.h):
        q, k, v = queries_keys_values(block, x, nh, kv_dtype, None if past is None else past[n], start)
        if n == layer:
            rows = q[0, head, first - start:]  # (R, hs)
            scores = (rows @ k[0, head].transpose(0, 1)) * (1.0 / math.sqrt(hs))  # (R, S)
            queries = torch.arange(first, S, device=ids.device)[:, None]  # (R, 1)
            keys = torch.arange(S, device=ids.device)[None, :]  # (1, S)
            scores = scores.float().masked_fill(keys > queries, float("-inf"))
            return torch.softmax(scores, dim=-1)
        mask = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=start)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None if start == 0 else mask, is_causal=start == 0)
        y = y.transpose(1, 2).contiguous().view(1, T, C)  # heads side by side
        x = x + block.attn.c_proj(y)
        x = x + block.mlp(block.ln_2(x))
        if between is not None:
            between()
    raise ValueError(f"no block {layer}: the model has {len(transformer.h)}")
