"""The token generator: sample a reply token by token and yield its text as it becomes printable.

    for piece in generate(loaded, prompt_ids, max_new_tokens=200, top_k=50, should_stop=cancelled):
        send(piece.text)          # may be "" (a token inside a multi-byte character)
    piece.stats                   # set on the last piece only

Sampling follows the owner's server: softmax over the last position's logits (divided by the
temperature), top-k, multinomial; stop at the first special id without emitting it. Text is decoded
incrementally as UTF-8: a character split across tokens comes out once complete, invalid bytes are
dropped (the same text as the owner's buffer-and-flush, but never held back behind a bad byte); a
trailing \r waits for the next token, so a split \r\n streams as one line break.

A reply on a model with a KV cache is a `Sequence`: its prompt is prefilled in chunks, then it is fed
one token per step. The core's batched decoder (webapp/chat/decode/batched.py) steps many Sequences together
with `decode_step`; `generate()` runs one alone, through exactly the same calls, so a reply does not
depend on who else is asking. Models without a KV cache run the owner's full-recompute loop over the
last block_size tokens. Cancellation (`should_stop`) is polled between prefill chunks and before
every step.

With a PrefixCache (webapp/chat/decode/prefix_cache.py), a kept KV cache is reused for the longest prefix its
token ids share with this prompt, and only the rest is prefilled. A reply with an edit (parts switched off)
has a KV cache of its own alone: it takes none from the holder and gives none back. Sampling draws from the reply's
private generator only after the prefill, so a seed gives the same tokens either way.

Per token there is one host/device sync (`.item()`, to decide whether to stop); the sampled id stays
on the device as the next step's input, and nothing already tokenized is tokenized again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import Any

import torch
from torch import nn

from webapp.chat.decode import readings, sampling
from webapp.chat.decode.odds import TokenOdds, token_odds
from webapp.chat.decode.pieces import GenerationStats, Piece, Pieces, TextDecoder
from webapp.chat.decode.prefix_cache import PrefixCache, common_prefix
from webapp.chat.decode.readings import Streams
from webapp.chat.decode.recompute import generate_recompute
from webapp.chat.decode.types import SamplingParams, decode_rate
from webapp.chat.model.edits import Edit
from webapp.chat.model.gpt import Chunk, KVCache, Taps
from webapp.chat.model.loading import LoadedChatModel

# Prefill runs in chunks, so a cancel lands quickly and, in the batched decoder, so the other replies'
# streams never wait long for their next token. How a prompt is cut into chunks changes its keys and
# values in the last bits, so the cut depends on the model alone, never on timing: a seeded reply is
# then the same every time, alone or batched. A chunk is about PREFILL_FLOPS of work: what the other rows'
# streams may stall for (docs/architecture.md; prefill times: docs/benchmarks.md, "One-stream decode").
PREFILL_FLOPS = 6e10
MIN_CHUNK, MAX_CHUNK = 16, 1024


def prefill_chunk(model: nn.Module) -> int:
    """Tokens per prefill chunk for this model: a power of two, about PREFILL_FLOPS of work."""
    params = sum(p.numel() for p in model.parameters())
    tokens = PREFILL_FLOPS / (2 * max(params, 1))
    return int(max(MIN_CHUNK, min(MAX_CHUNK, 2 ** max(0, round(math.log2(max(tokens, 1)))))))


class Sequence:
    """One reply on a KV-cached model: a row of the batched decoder, or alone (a batch of one).

    prefill_chunk() runs the prompt a chunk at a time and samples the first token after the last
    chunk; then decode_step() feeds one token per step. New text collects in `pieces` until the
    consumer takes it; close() ends the reply, hands its cache to the prefix holder and returns the
    last Piece with the stats."""

    def __init__(self, loaded: LoadedChatModel, prompt_ids: Seq[int], params: SamplingParams,
                 prefix: PrefixCache | None = None, odds: bool = False, forced: Seq[int] = (),
                 forced_odds: Seq[TokenOdds | None] = (), edit: Edit | None = None, features: bool = False) -> None:
        params.check()
        if len(prompt_ids) == 0:
            raise ValueError("prompt_ids is empty")
        self.t0 = time.perf_counter()
        self.model: Any = loaded.model  # a GPT with a KV cache (new_cache, prefill, decode_step)
        self.tok, self.block_size = loaded.tokenizer, loaded.block_size
        weight = next(self.model.parameters())
        self.device = weight.device
        self.dtype = getattr(self.model, "kv_dtype", None) or weight.dtype  # its KV cache's (prefix reuse)
        self.params, self.prefix, self.want_odds = params, prefix, odds
        # what the model's dictionaries read at each token, from the stream each step computes anyway
        self.reader = readings.ReplyReader((loaded.dictionaries or {}) if features else {})
        self.edit = edit  # outputs replaced in every forward of this reply (webapp/chat/model/edits.py)
        self.gen = sampling.generator(self.device, params.seed)
        self.decoder = TextDecoder()
        self.ids = list(prompt_ids)  # the prompt, then the reply
        self.prompt_tokens = len(self.ids)
        self.cache: KVCache | None = None
        self.cached: list[int] = []  # ids whose keys/values are in the cache, by position
        self.todo: list[int] = []  # ids of the window still to prefill
        self.chunk = prefill_chunk(self.model)
        self.next_token: torch.Tensor | None = None  # (1, 1): the sampled id, fed at the next step
        self.pieces: list[Piece] = []
        self.new_tokens, self.reused = 0, 0
        self.t_first: float | None = None
        self.stop_reason: str | None = None  # "end", "length", "cancelled" once finished
        self.given = 0  # of new_tokens, those forced rather than sampled: they cost no decode step
        self._force(forced, forced_odds)
        if not self.finished:
            self._open_window()

    # -- state -----------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.stop_reason is not None

    @property
    def prefilling(self) -> bool:
        return not self.finished and bool(self.todo)

    @property
    def decoding(self) -> bool:
        return not self.finished and not self.todo

    @property
    def position(self) -> int:
        return len(self.cached)

    # -- work ------------------------------------------------------------------------------
    def _force(self, forced: Seq[int], odds: Seq[TokenOdds | None]) -> None:
        """The reply's first tokens are given (a branch from a token of another version): they become
        its first pieces, as if sampled, and the model goes on from them."""
        for i, token in enumerate(forced):
            if self.tok.is_special(token):  # forcing the end: the reply ends there
                self.stop_reason = "end"
                return
            self.new_tokens += 1
            self.given += 1
            self.reader.add(None)
            self.ids.append(token)
            self.pieces.append(Piece(self.decoder.decode(self.tok.decode_single_token_bytes(token)),
                                     self.new_tokens, 0.0, token=token, odds=odds[i] if i < len(odds) else None,
                                     given=True))
            if self.new_tokens >= self.params.max_new_tokens:
                self.stop_reason = "length"
                return

    def _open_window(self) -> None:
        """Start (or, once the window is full, restart) the prefill of the last block_size ids."""
        window = self.ids[-self.block_size:]
        start = 0
        if self.cache is None:
            # an edited run's KV cache is its own alone: it neither starts from a kept one nor is kept
            entry = (self.prefix.take(window, self.device, self.dtype, self.model)
                     if self.prefix is not None and self.edit is None else None)
            if entry is not None and entry.cache.max_len >= self.block_size:
                self.cache = entry.cache
                # at least the last prompt token is run again: its logits give the first reply token
                start = self.reused = min(common_prefix(entry.ids, window), len(window) - 1)
            else:
                self.cache = self.model.new_cache(batch=1, max_len=self.block_size)
        # else: the window slides as the owner's loop crops to the last block_size tokens; positions
        # shift, so nothing is reusable (a full prefill per token: PromptBuilder's prompts never get here)
        self.cached, self.todo = window[:start], window[start:]

    def prefill_chunk(self) -> int:
        """Run the next chunk of the prompt; after the last one, sample the first token. -> tokens run."""
        piece = self.next_chunk
        taps = tap(self.reader.blocks) if self.last_chunk else None
        with torch.inference_mode():
            # chunks before the last skip lm_head: only the prompt's last position needs logits
            logits = self.model.prefill([self.chunk_to_run], *tapping(taps))[0]
        self.prefilled(logits, tapped(taps))
        return len(piece)

    @property
    def chunk_to_run(self) -> Chunk:
        """The next prefill chunk as the model runs it (GPT.prefill), alone or beside other replies'."""
        assert self.cache is not None  # a reply still prefilling has its cache
        return Chunk(self.next_chunk, self.cache, self.position, self.last_chunk, self.edit)

    @property
    def next_chunk(self) -> list[int]:
        """The ids the next prefill chunk runs: cut by the model's size alone (prefill_chunk)."""
        return self.todo[:self.chunk]

    @property
    def last_chunk(self) -> bool:
        """Whether the next chunk ends the prompt (its last position's logits give the first token)."""
        return len(self.todo) <= self.chunk

    def prefilled(self, logits: torch.Tensor | None, streams: Streams | None = None) -> None:
        """The next chunk has run (its keys and values are in the cache): after the last, sample. streams:
        the stream after the blocks this reply's dictionaries read, at the prompt's last position (1, C)."""
        piece, last = self.next_chunk, self.last_chunk
        self.cached += piece
        self.todo = self.todo[len(piece):]
        if last:
            assert logits is not None
            next_id = self.sample(logits)
            self.accept(next_id, _odds([self], logits, [next_id])[0], streams)

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token from this reply's logits (1, V), with its own settings and generator -> (1, 1)."""
        p = self.params
        with torch.inference_mode():
            return sampling.sample(logits, p.temperature, p.top_k, self.gen)  # stays on the device

    def accept(self, next_id: torch.Tensor, odds: TokenOdds | None = None, streams: Streams | None = None) -> None:
        """Take a sampled token: stop on a special, else publish its text and get ready for the next."""
        p = self.params
        token = int(next_id.item())  # the one host sync per token: we must know whether to stop
        now = time.perf_counter() - self.t0
        if self.t_first is None:
            self.t_first = now
        if self.tok.is_special(token):
            self.stop_reason = "end"
            return
        self.new_tokens += 1
        self.ids.append(token)
        self.pieces.append(Piece(self.decoder.decode(self.tok.decode_single_token_bytes(token)),
                                 self.new_tokens, now, token=token, odds=odds))
        self.reader.add(streams)
        if self.new_tokens == p.max_new_tokens:
            self.stop_reason = "length"
        elif self.position >= self.block_size:
            self._open_window()
        else:
            self.next_token = next_id

    def cancel(self) -> None:
        if not self.finished:
            self.stop_reason = "cancelled"

    def drain(self) -> list[Piece]:
        pieces, self.pieces = self.pieces, []
        return pieces

    def close(self, keep: bool = True) -> Piece:
        """End the reply: keep its cache for the next turn (not after a failure) -> the last Piece."""
        if self.prefix is not None and self.cache is not None:
            if keep and self.edit is None:
                self.prefix.put(self.cache, self.cached, self.model)
            self.prefix.record(self.reused)
        self.cache = None
        self.cancel()
        total = time.perf_counter() - self.t0
        n, first = self.new_tokens, self.t_first
        stats = GenerationStats(self.prompt_tokens, n, first, total, decode_rate(n - self.given, first, total),
                                self.stop_reason or "cancelled", True, self.reused)
        return Piece(self.decoder.decode(b"", final=True), n, total, stats, readings=self.reader.readings())

    @property
    def cache_bytes(self) -> int:
        return int(getattr(self.cache, "nbytes", 0))


def decode_step(model: Any, seqs: list[Sequence]) -> None:
    """One token for every decoding Sequence at once: the weights are read once for all rows."""
    idx = torch.cat([s.next_token for s in seqs if s.next_token is not None])  # (B, 1)
    taps = tap(frozenset().union(*(s.reader.blocks for s in seqs)))
    with torch.inference_mode():
        logits = model.decode_step(idx, [s.cache for s in seqs], [s.position for s in seqs],
                                   [s.edit for s in seqs], *tapping(taps))  # (B, V)
    picks = [s.sample(logits[row:row + 1]) for row, s in enumerate(seqs)]
    for row, (s, next_id, odds) in enumerate(zip(seqs, picks, _odds(seqs, logits, picks))):
        s.cached.append(s.ids[-1])
        s.accept(next_id, odds, tapped(taps, row, s.reader.blocks))


def _odds(seqs: list[Sequence], logits: torch.Tensor, picks: list[torch.Tensor]) -> list[TokenOdds | None]:
    """The odds of the picks of the rows that want them, computed for those rows at once."""
    rows = [r for r, s in enumerate(seqs) if s.want_odds]
    out: list[TokenOdds | None] = [None] * len(seqs)
    if rows:
        with torch.inference_mode():
            found = token_odds(logits[rows], torch.cat([picks[r] for r in rows]).view(-1),
                               [seqs[r].params.temperature for r in rows], [seqs[r].params.top_k for r in rows])
        for r, odds in zip(rows, found):
            out[r] = odds
    return out


def tap(blocks: frozenset[int]) -> Taps | None:
    """The taps a forward fills in for these blocks (GPT.prefill, GPT.decode_step); None for none."""
    return {block: None for block in blocks} or None


def tapped(taps: Taps | None, row: int = 0, blocks: frozenset[int] | None = None) -> Streams | None:
    """Row `row` of what a forward tapped (1, C) per block (of `blocks`, None: all); None where nothing was."""
    if taps is None:
        return None
    return {block: t[row:row + 1] for block, t in taps.items() if t is not None and (blocks is None or block in blocks)}


def tapping(taps: Taps | None) -> tuple[Taps, ...]:
    """The taps argument where there are any: a model read without dictionaries is called as before them."""
    return () if taps is None else (taps,)


def generate(
    loaded: LoadedChatModel,
    prompt_ids: Seq[int],
    *,
    max_new_tokens: int = 200,
    temperature: float = 1.0,
    top_k: int = 50,
    seed: int | None = None,
    should_stop: Callable[[], bool] | None = None,
    prefix_cache: PrefixCache | None = None,
    odds: bool = False,
    forced: Seq[int] = (),
    forced_odds: Seq[TokenOdds | None] = (),
    edit: Edit | None = None,
    features: bool = False,
) -> Pieces:
    """Yield a Piece per sampled token, then a last Piece carrying GenerationStats.

    loaded: a LoadedChatModel. temperature 0 is greedy; top_k 0 samples the whole vocabulary.
    seed makes sampling reproducible with a private generator (the global RNG is untouched).
    prefix_cache: reuse (and afterwards keep) the KV cache of an unchanged prompt prefix; only the
    core's worker may pass one, since the cache lives on the device.
    odds: give each Piece the model's odds for its token (webapp/chat/decode/odds.py).
    forced: the reply's first tokens, given rather than sampled (with their odds, where known).
    edit: heads' and MLPs' outputs replaced in every forward (webapp/chat/model/edits.py); a model with a
    KV cache only (the edited run's keys and values stay its own: never taken from or kept in prefix_cache).
    features: the last Piece carries what the model's dictionaries read at each token (decode/readings.py).
    Raises ValueError for arguments out of range, before any work.
    """
    params = SamplingParams(max_new_tokens, temperature, top_k, seed)
    params.check()
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty")
    should_stop = should_stop or (lambda: False)
    if loaded.supports_kv_cache:
        return _generate_cached(Sequence(loaded, prompt_ids, params, prefix_cache, odds, forced, forced_odds, edit,
                                         features), should_stop)
    if edit is not None:
        raise ValueError("edits need a model with a KV cache (Glassbox's GPT)")
    return generate_recompute(loaded, list(prompt_ids), params, should_stop, odds, forced, forced_odds)


def _generate_cached(seq: Sequence, should_stop: Callable[[], bool]) -> Pieces:
    failed = True  # a cache left by an exception mid-forward is dropped, not reused
    try:
        while not seq.finished:
            if should_stop():
                seq.cancel()
            elif seq.prefilling:
                seq.prefill_chunk()
            else:
                decode_step(seq.model, [seq])
            yield from seq.drain()
        failed = False
    except GeneratorExit:  # the consumer closed us at a yield: the cache is consistent
        failed = False
        raise
    finally:
        last = seq.close(keep=not failed)
    yield last
