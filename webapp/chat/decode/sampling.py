"""Drawing the next token as the owner's server does: softmax over the last position's logits divided by
the temperature, top-k, multinomial, from the reply's private generator (the global RNG is never touched)."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def sample(logits: torch.Tensor, temperature: float, top_k: int, gen: torch.Generator) -> torch.Tensor:
    """logits (1, V) -> next token id (1, 1)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # greedy
    logits = logits.float() / temperature
    if 0 < top_k < logits.size(-1):
        top_logits, top_ids = torch.topk(logits, top_k, dim=-1)  # (1, k)
        choice = torch.multinomial(F.softmax(top_logits, dim=-1), 1, generator=gen)  # (1, 1) into top_ids
        return torch.gather(top_ids, -1, choice)
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=gen)


def generator(device: torch.device, seed: int | None) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()  # fresh entropy, global RNG untouched
    else:
        gen.manual_seed(seed)
    return gen
