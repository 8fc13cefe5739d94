"""Causal self-attention's math, written once: the serving paths (webapp/chat/model/gpt.py) and the hooked
forward every experiment reads (webapp/chat/model/hooked.py) both call these, so a head's output means the
same thing wherever it is computed (the C kernel, webapp/chat/model/kernels, is the one other copy).

    q, k, v = split(c_attn(ln_1(x)))                       (B, nh, T, hs) each
    A = softmax(q kᵀ / √hs, causal)                        query i at position S - T + i sees keys 0..S - T + i
    y = A v                                                (B, nh, T, hs): each head's output, before c_proj

Shapes: B batch, T queries (the positions run), S keys (every position up to the last query), C n_embd,
nh heads, hs = C // nh head size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import functional as F


def split_heads(qkv: Tensor, n_head: int) -> tuple[Tensor, Tensor, Tensor]:
    """(B, T, 3C) queries, keys and values side by side -> q, k, v, each (B, nh, T, hs)."""
    B, T, C3 = qkv.size()
    C = C3 // 3
    q, k, v = (qkv[..., i * C:(i + 1) * C].view(B, T, n_head, C // n_head).transpose(1, 2) for i in range(3))
    return q, k, v


def merge_heads(y: Tensor) -> Tensor:
    """(B, nh, T, hs) heads' outputs -> (B, T, C), heads side by side (what c_proj reads)."""
    B, nh, T, hs = y.size()
    return y.transpose(1, 2).contiguous().view(B, T, nh * hs)


def causal_mask(T: int, S: int, device: torch.device) -> Tensor:
    """(T, S) bool: query i, at position S - T + i, may read keys 0..S - T + i."""
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)


def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """q (B, nh, T, hs) at the last T of S positions, k and v (B, nh, S, hs) -> (B, nh, T, hs), causal.

    One query sees every key (no mask); queries that start at position 0 take SDPA's own causal mask; a
    later chunk spells its mask out (SDPA's is_causal aligns it top-left, which is wrong when T != S)."""
    T, S = q.size(2), k.size(2)
    if T == 1:
        return F.scaled_dot_product_attention(q, k, v)
    if T == S:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(T, S, q.device))


def pattern(q: Tensor, k: Tensor) -> Tensor:
    """q (B, nh, R, hs) at the last R of S positions, k (B, nh, S, hs) -> (B, nh, R, S) float32 attention
    weights, softmax(q kᵀ / √hs) with the causal mask: each row sums to 1, zero after its query."""
    R, S = q.size(2), k.size(2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (B, nh, R, S)
    scores = scores.float()
    if R > 1:
        scores = scores.masked_fill(~causal_mask(R, S, q.device), float("-inf"))
    return torch.softmax(scores, dim=-1)
