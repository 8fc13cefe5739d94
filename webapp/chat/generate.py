"""The token generator: sample a reply token by token and yield its text as it becomes printable.

    for piece in generate(loaded, prompt_ids, max_new_tokens=200, top_k=50, should_stop=cancelled):
        send(piece.text)          # may be "" (a token inside a multi-byte character)
    piece.stats                   # set on the last piece only

Sampling follows the owner's server: softmax over the last position's logits (divided by the
temperature), top-k, multinomial; stop at the first special id without emitting it. Text is decoded
incrementally as UTF-8: a character split across tokens comes out once complete, invalid bytes are
dropped (the same text as the owner's buffer-and-flush, but never held back behind a bad byte); a
trailing \r waits for the next token, so a split \r\n streams as one line break.

Models with a KV cache prefill the prompt in chunks, then feed one token per step; others run the
owner's full-recompute loop over the last block_size tokens. Cancellation (`should_stop`) is polled
between prefill chunks and before every step.

With a PrefixCache (webapp/chat/prefix_cache.py), the KV cache of the previous generation is reused
for the longest prefix its token ids share with this prompt, and only the rest is prefilled. Sampling
draws from a private generator only after the prefill, so a seed gives the same tokens either way.

Per token there is one host/device sync (`.item()`, to decide whether to stop); the sampled id stays
on the device as the next step's input, and nothing already tokenized is tokenized again.
"""

from __future__ import annotations

import codecs
import inspect
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch.nn import functional as F

from webapp.chat.prefix_cache import PrefixCache, common_prefix

# Prefill runs in chunks so a cancel lands quickly even during a long prompt. The first chunk is
# PREFILL_CHUNK tokens; later ones are sized from the measured rate to about PREFILL_SECONDS of work,
# since small chunks cost throughput (254M, 800 tokens, one thread: 128-token chunks took 1.26x the
# time of one pass in fp32 and 2x in bf16).
PREFILL_CHUNK = 128
PREFILL_SECONDS = 0.5


@dataclass
class GenerationStats:
    prompt_tokens: int
    new_tokens: int  # tokens kept in the reply (the stopping special token is not counted)
    time_to_first_token_s: float | None  # from the call to the first sampled token (prefill included)
    total_s: float
    decode_tokens_per_s: float | None  # tokens after the first / time after the first
    stop_reason: str  # "end" (a special token), "length" (max_new_tokens), "cancelled"
    kv_cache: bool
    reused_tokens: int = 0  # prompt positions whose keys/values came from the prefix cache


@dataclass
class Piece:
    text: str  # newly printable text; "" while a multi-byte character is incomplete
    tokens: int  # reply tokens so far
    elapsed_s: float  # since generate() was called
    stats: GenerationStats | None = None  # only on the last piece
    token: int | None = None  # the sampled id (None on the last piece)


class _TextDecoder:
    """Token bytes in, printable text out: UTF-8 decoded incrementally, and a trailing \r held back
    until the next piece, so a \r\n split across two tokens streams as one line break (the page
    and SSE both read a lone \r as a break of its own)."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        self._cr = ""

    def decode(self, data: bytes, final: bool = False) -> str:
        text = self._cr + self._utf8.decode(data, final=final)
        self._cr = "\r" if text.endswith("\r") and not final else ""
        return text[:-1] if self._cr else text


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
    """Logits via the model's KV cache: a chunked prefill of what the cache lacks, then one token per step."""

    def __init__(self, model, block_size: int, device, prefix: PrefixCache | None = None):
        self.model, self.block_size, self.device, self.prefix = model, block_size, device, prefix
        # chunks before the last skip lm_head when the model can (the project's GPT can): only the
        # prompt's last position needs logits, and lm_head is a fifth of a 254M model's weights
        self.skip_logits = "logits" in inspect.signature(model.forward_cached).parameters
        self.cache = None
        self.ids: list[int] = []  # token ids whose keys/values are in self.cache, by position
        self.reused = 0

    def _start(self, window: list[int]) -> int:
        """Get a cache; returns how many leading positions of `window` it already holds."""
        if self.cache is not None:  # sliding the window: positions shift, nothing is reusable
            return 0
        p = next(self.model.parameters())
        entry = self.prefix.take(p.device, p.dtype) if self.prefix is not None else None
        if entry is None or entry.cache.max_len < self.block_size:
            self.cache = self.model.new_cache(batch=1, max_len=self.block_size)
            return 0
        self.cache = entry.cache
        # at least the last prompt token is run again: its logits give the first reply token
        self.reused = min(common_prefix(entry.ids, window), len(window) - 1)
        return self.reused

    def prefill(self, ids: Sequence[int], should_stop) -> torch.Tensor | None:
        window = list(ids[-self.block_size:])
        start = self._start(window)
        self.ids = window[:start]
        todo = torch.tensor([window[start:]], dtype=torch.long, device=self.device)  # (1, T)
        logits, offset, chunk = None, 0, PREFILL_CHUNK
        while offset < todo.size(1):
            if should_stop():
                return None
            t = time.perf_counter()
            piece = todo[:, offset:offset + chunk]
            with torch.inference_mode():
                if self.skip_logits:
                    last = offset + chunk >= todo.size(1)
                    logits = self.model.forward_cached(piece, self.cache, start + offset, logits=last)
                else:
                    logits = self.model.forward_cached(piece, self.cache, start + offset)
            self.ids += window[start + offset:start + offset + chunk]
            offset += chunk
            rate = chunk / max(time.perf_counter() - t, 1e-6)  # tokens/s (launch rate on a GPU: then big chunks)
            chunk = max(PREFILL_CHUNK, int(rate * PREFILL_SECONDS))
        return logits

    def step(self, token: torch.Tensor, ids: Sequence[int], should_stop) -> torch.Tensor | None:
        if len(self.ids) >= self.block_size:
            # the window is full: slide it, as the owner's loop crops to the last block_size
            # tokens. Costs a full prefill per token; prompts from PromptBuilder never get here.
            return self.prefill(ids, should_stop)
        with torch.inference_mode():
            logits = self.model.forward_cached(token, self.cache, len(self.ids))  # token (1, 1) -> (1, V)
        self.ids.append(ids[-1])
        return logits

    def finish(self, keep: bool) -> None:
        """Hand the cache to the prefix holder for the next turn (or drop it after a failure)."""
        if self.prefix is not None and self.cache is not None:
            if keep:
                self.prefix.put(self.cache, self.ids)
            self.prefix.record(self.reused)
        self.cache = None


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

    def finish(self, keep: bool) -> None:
        pass


def generate(
    loaded,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int = 200,
    temperature: float = 1.0,
    top_k: int = 50,
    seed: int | None = None,
    should_stop: Callable[[], bool] | None = None,
    prefix_cache: PrefixCache | None = None,
) -> Iterator[Piece]:
    """Yield a Piece per sampled token, then a last Piece carrying GenerationStats.

    loaded: a LoadedChatModel. temperature 0 is greedy; top_k 0 samples the whole vocabulary.
    seed makes sampling reproducible with a private generator (the global RNG is untouched).
    prefix_cache: reuse (and afterwards keep) the KV cache of an unchanged prompt prefix; only the
    core's worker may pass one, since the cache lives on the device. Close the generator (or run it
    to the end) before the next generation, or that one starts cold.
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
                     should_stop or (lambda: False), prefix_cache if loaded.supports_kv_cache else None)


def _generate(loaded, ids, max_new_tokens, temperature, top_k, seed, should_stop, prefix_cache):
    t0 = time.perf_counter()
    model, tok = loaded.model, loaded.tokenizer
    device = next(model.parameters()).device
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()  # fresh entropy, global RNG untouched
    else:
        gen.manual_seed(seed)
    if loaded.supports_kv_cache:
        steps = _CachedSteps(model, loaded.block_size, device, prefix_cache)
    else:
        steps = _RecomputeSteps(model, loaded.block_size, device)
    decoder = _TextDecoder()
    prompt_tokens, n, t_first, reason = len(ids), 0, None, "length"

    failed = True  # a cache left by an exception mid-forward is dropped, not reused
    try:
        logits = steps.prefill(ids, should_stop)
        while logits is not None:
            with torch.inference_mode():
                next_id = _sample(logits, temperature, top_k, gen)  # (1, 1), stays on the device
            token = next_id.item()  # the one host sync per token: we must know whether to stop
            if t_first is None:
                t_first = time.perf_counter() - t0
            if tok.is_special(token):
                reason = "end"
                break
            n += 1
            ids.append(token)
            yield Piece(decoder.decode(tok.decode_single_token_bytes(token)), n, time.perf_counter() - t0,
                        token=token)
            if n == max_new_tokens:
                break
            logits = None if should_stop() else steps.step(next_id, ids, should_stop)
        else:
            reason = "cancelled"
        failed = False
    except GeneratorExit:  # the consumer closed us at a yield: the cache is consistent
        failed = False
        raise
    finally:
        steps.finish(keep=not failed)

    total = time.perf_counter() - t0
    rate = (n - 1) / (total - t_first) if n > 1 and total > t_first else None
    reused = steps.reused if loaded.supports_kv_cache else 0
    stats = GenerationStats(prompt_tokens, n, t_first, total, rate, reason, loaded.supports_kv_cache, reused)
    yield Piece(decoder.decode(b"", final=True), n, total, stats)
