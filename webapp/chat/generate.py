"""The token generator: sample a reply token by token and yield its text as it becomes printable.

    for piece in generate(loaded, prompt_ids, max_new_tokens=200, top_k=50, should_stop=cancelled):
        send(piece.text)          # may be "" (a token inside a multi-byte character)
    piece.stats                   # set on the last piece only

Sampling follows the owner's server: softmax over the last position's logits (divided by the
temperature), top-k, multinomial; stop at the first special id without emitting it. Text is decoded
incrementally as UTF-8: a character split across tokens comes out once complete, invalid bytes are
dropped (the same text as the owner's buffer-and-flush, but never held back behind a bad byte).

Models with a KV cache prefill the prompt in chunks, then feed one token per step; others run the
owner's full-recompute loop over the last block_size tokens. Cancellation (`should_stop`) is polled
between prefill chunks and before every step.
"""

from __future__ import annotations

import codecs
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch.nn import functional as F

PREFILL_CHUNK = 128  # tokens per prefill call: keeps a cancel under ~1 s even for long prompts


@dataclass
class GenerationStats:
    prompt_tokens: int
    new_tokens: int  # tokens kept in the reply (the stopping special token is not counted)
    time_to_first_token_s: float | None  # from the call to the first sampled token (prefill included)
    total_s: float
    decode_tokens_per_s: float | None  # tokens after the first / time after the first
    stop_reason: str  # "end" (a special token), "length" (max_new_tokens), "cancelled"
    kv_cache: bool


@dataclass
class Piece:
    text: str  # newly printable text; "" while a multi-byte character is incomplete
    tokens: int  # reply tokens so far
    elapsed_s: float  # since generate() was called
    stats: GenerationStats | None = None  # only on the last piece


def _sample(logits: torch.Tensor, temperature: float, top_k: int, gen: torch.Generator) -> torch.Tensor:
    """logits (B, V) -> next token ids (B, 1)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)  # greedy
    logits = logits.float() / temperature
    if 0 < top_k < logits.size(-1):
        top_logits, top_ids = torch.topk(logits, top_k, dim=-1)  # (B, k)
        choice = torch.multinomial(F.softmax(top_logits, dim=-1), 1, generator=gen)  # (B, 1) into top_ids
        return torch.gather(top_ids, -1, choice)
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=gen)


class _CachedSteps:
    """Logits via the model's KV cache: one chunked prefill, then one token per step."""

    def __init__(self, model, block_size: int, device):
        self.model, self.block_size, self.device = model, block_size, device
        self.cache, self.pos = None, 0

    def prefill(self, ids: Sequence[int], should_stop) -> torch.Tensor | None:
        window = torch.tensor([list(ids[-self.block_size:])], dtype=torch.long, device=self.device)  # (1, T)
        self.cache = self.model.new_cache(batch=1, max_len=self.block_size)
        logits = None
        for start in range(0, window.size(1), PREFILL_CHUNK):
            if should_stop():
                return None
            with torch.inference_mode():
                logits = self.model.forward_cached(window[:, start:start + PREFILL_CHUNK], self.cache, start)
        self.pos = window.size(1)
        return logits

    def step(self, token: torch.Tensor, ids: Sequence[int], should_stop) -> torch.Tensor | None:
        if self.pos >= self.block_size:
            # the window is full: slide it, as the owner's loop crops to the last block_size
            # tokens. Costs a full prefill per token; prompts from PromptBuilder never get here.
            return self.prefill(ids, should_stop)
        with torch.inference_mode():
            logits = self.model.forward_cached(token, self.cache, self.pos)  # token (1, 1) -> (1, V)
        self.pos += 1
        return logits


class _RecomputeSteps:
    """Logits by running the whole (cropped) sequence every step: the owner's loop, any model."""

    def __init__(self, model, block_size: int, device):
        self.model, self.block_size, self.device = model, block_size, device

    def prefill(self, ids: Sequence[int], should_stop) -> torch.Tensor | None:
        return None if should_stop() else self.step(None, ids, should_stop)

    def step(self, token, ids: Sequence[int], should_stop) -> torch.Tensor:
        window = torch.tensor([list(ids[-self.block_size:])], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            logits, _ = self.model(window)
        return logits[:, -1, :]  # (1, V) whether the model returns all positions or the last only


def generate(
    loaded,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int = 200,
    temperature: float = 1.0,
    top_k: int = 50,
    seed: int | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Iterator[Piece]:
    """Yield a Piece per sampled token, then a last Piece carrying GenerationStats.

    loaded: a LoadedChatModel. temperature 0 is greedy; top_k 0 samples the whole vocabulary.
    seed makes sampling reproducible with a private generator (the global RNG is untouched).
    Raises ValueError for arguments out of range, before any work.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = whole vocabulary), got {top_k}")
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty")
    return _generate(loaded, list(prompt_ids), max_new_tokens, temperature, top_k, seed,
                     should_stop or (lambda: False))


def _generate(loaded, ids, max_new_tokens, temperature, top_k, seed, should_stop):
    t0 = time.perf_counter()
    model, tok = loaded.model, loaded.tokenizer
    device = next(model.parameters()).device
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()  # fresh entropy, global RNG untouched
    else:
        gen.manual_seed(seed)
    steps = (_CachedSteps if loaded.supports_kv_cache else _RecomputeSteps)(model, loaded.block_size, device)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")
    prompt_tokens, n, t_first, reason = len(ids), 0, None, "length"

    logits = steps.prefill(ids, should_stop)
    while logits is not None:
        with torch.inference_mode():
            next_id = _sample(logits, temperature, top_k, gen)  # (1, 1)
        token = next_id.item()  # the one host sync per token: we must know whether to stop
        if t_first is None:
            t_first = time.perf_counter() - t0
        if tok.is_special(token):
            reason = "end"
            break
        n += 1
        ids.append(token)
        yield Piece(decoder.decode(tok.decode_single_token_bytes(token)), n, time.perf_counter() - t0)
        if n == max_new_tokens:
            break
        logits = None if should_stop() else steps.step(next_id, ids, should_stop)
    else:
        reason = "cancelled"

    total = time.perf_counter() - t0
    rate = (n - 1) / (total - t_first) if n > 1 and total > t_first else None
    stats = GenerationStats(prompt_tokens, n, t_first, total, rate, reason, loaded.supports_kv_cache)
    yield Piece(decoder.decode(b"", final=True), n, total, stats)
