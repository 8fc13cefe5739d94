"""Reuse the keys/values of an unchanged prompt prefix across chat turns.

A follow-up turn re-sends the whole conversation: [bos, *fewshot, *earlier turns, *new turn,
assistant_start]. Everything up to the new turn was already run through the model by the previous
reply, so its keys and values sit in that reply's KV cache. Keeping that cache (and the token ids
at its positions) lets the next prompt prefill only what differs after the longest common prefix.

Several conversations are served at once, so the holder keeps several caches — one per finished
reply — under a byte budget (GLASSBOX_KV_CACHE_MB), the least recently used evicted first.

Ownership: built at boot (webapp/chat/boot.py, one per loaded model) and passed to what uses it (the
batched executor and its replies, the warm-up's pinned head, Inside); no module holds one. Used only on
the core's worker (the device owner). `take()` hands a cache to one generation and removes it from the
holder until `put()` returns it, so two generations can never write the same cache; a generation that
fails simply never puts it back.

Entries are keyed by (model, variant, ids). The keys/values of a token prefix depend only on the weights
and on the run's edit (webapp/chat/model/edits.py), so a reply may reuse any entry of its own model and
variant — None for the model's own runs, an edit's key for an edited run — and none other: an edited
run's keys and values never reach another run, nor a plain run's an edited one. The chat's replies keep
only plain runs here: a reply with parts switched off has a KV cache of its own alone (generate.Sequence).

One entry per model may be pinned (`pin`): the head every prompt of the model starts with (bos and the few-shot
turns, run once at warm-up). It is never evicted nor handed out: a prompt whose longest kept prefix is
no longer than the head gets a copy of it. So replies arriving together (more than there are kept
caches) each prefill only their own turns, and a new conversation no longer takes another
conversation's kept cache for the few-shot turns they share.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from webapp.chat.model.gpt import KVCache

DEFAULT_BUDGET_BYTES = 1024 * 2**20


@dataclass
class CachedPrefix:
    cache: KVCache
    ids: list[int]  # token ids at positions 0..len(ids)-1 of `cache`; positions past it are garbage
    model: object = None  # the model that computed them (compared by identity)
    variant: str | None = None  # the run's edit key (Edit.key); None: the model's own run

    def belongs(self, model: object, variant: str | None) -> bool:
        return self.model is model and self.variant == variant


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _nbytes(cache: KVCache) -> int:
    return int(getattr(cache, "nbytes", 0))


class PrefixCache:
    """Finished replies' KV caches and the ids they hold, by model and variant, least recently used first."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self._entries: collections.deque[CachedPrefix] = collections.deque()  # oldest first
        self._lock = threading.Lock()
        self.hits = 0  # generations that reused at least one position
        self.reused_tokens = 0  # positions not prefilled again, all generations together
        self.evictions = 0
        # per model: the prompts' common head (copied, never taken), and the positions a copy holds
        self._pinned: list[tuple[CachedPrefix, int]] = []

    def take(self, ids: Sequence[int], device: torch.device, dtype: torch.dtype, model: object,
             variant: str | None = None) -> CachedPrefix | None:
        """The kept entry of this model and variant sharing the longest prefix with `ids`, now owned by the
        caller (removed from the holder); None when no entry shares a first token (a new cache is cheaper
        than evicting)."""
        with self._lock:
            best, shared = self._longest(ids, model, variant)
            pinned, pinned_len = self._pinned_of(model, variant)
            if pinned is not None and 0 < common_prefix(pinned.ids, ids) >= shared:
                best = None  # the head covers as much: copy it rather than take a conversation's cache
            elif best is None:
                return None
            else:
                self._entries.remove(best)
        if best is None:
            assert pinned is not None
            best = CachedPrefix(pinned.cache.copy(pinned_len, len(pinned.ids)), list(pinned.ids), model, variant)
        layer0 = best.cache.k[0]
        if layer0.device != device or layer0.dtype != dtype:
            return None  # the model moved or changed dtype since: start cold
        return best

    def pin(self, cache: KVCache, ids: Sequence[int], max_len: int, model: object) -> None:
        """Keep `cache` (holding `ids`, computed by `model`'s own run) as the head every prompt of that
        model starts with; takes get copies of max_len positions. Outside the byte budget: it is one small
        cache per model for the process's life."""
        with self._lock:
            self._pinned = [(p, n) for p, n in self._pinned if p.model is not model]
            self._pinned.append((CachedPrefix(cache, list(ids), model), max_len))

    def peek(self, ids: Sequence[int], model: object,
             variant: str | None = None) -> tuple[CachedPrefix | None, int]:
        """The kept entry of this model and variant sharing the longest prefix with `ids`, and that length,
        left in the holder: for reading on the worker (Inside) before anything else can take it."""
        with self._lock:
            best, shared = self._longest(ids, model, variant)
            pinned, _ = self._pinned_of(model, variant)
            if pinned is not None and common_prefix(pinned.ids, ids) > shared:
                return pinned, common_prefix(pinned.ids, ids)
            return best, shared

    def _longest(self, ids: Sequence[int], model: object, variant: str | None) -> tuple[CachedPrefix | None, int]:
        """Under the lock: the entry of this model and variant sharing the longest prefix with `ids` (None
        if none shares a first token), and that length."""
        best, shared = None, 0
        for entry in self._entries:
            n = common_prefix(entry.ids, ids) if entry.belongs(model, variant) else 0
            if n > shared:
                best, shared = entry, n
        return best, shared

    def _pinned_of(self, model: object, variant: str | None) -> tuple[CachedPrefix | None, int]:
        """Under the lock: the model's pinned head, for its own runs only (an edited run computes other
        keys and values), and the positions a copy of it holds."""
        for pinned, max_len in self._pinned:
            if pinned.belongs(model, variant):
                return pinned, max_len
        return None, 0

    def put(self, cache: KVCache, ids: Sequence[int], model: object, variant: str | None = None) -> None:
        """Keep a cache (of `model`'s run with this variant) as the most recent entry; evict the least
        recent ones beyond the budget."""
        with self._lock:
            self._entries.append(CachedPrefix(cache, list(ids), model, variant))
            while self._entries and self._bytes() > self.budget_bytes:
                self._entries.popleft()
                self.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def record(self, reused: int) -> None:
        if reused:
            self.hits += 1
            self.reused_tokens += reused

    @property
    def nbytes(self) -> int:
        """Memory held by kept entries (running replies' caches are not counted here)."""
        with self._lock:
            return self._bytes() + sum(_nbytes(pinned.cache) for pinned, _ in self._pinned)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _bytes(self) -> int:
        return sum(_nbytes(e.cache) for e in self._entries)
