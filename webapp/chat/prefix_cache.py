"""Reuse the keys/values of an unchanged prompt prefix across chat turns.

A follow-up turn re-sends the whole conversation: [bos, *fewshot, *earlier turns, *new turn,
assistant_start]. Everything up to the new turn was already run through the model by the previous
reply, so its keys and values sit in that reply's KV cache. Keeping that cache (and the token ids
at its positions) lets the next prompt prefill only what differs after the longest common prefix.

Ownership: one PrefixCache per loaded model, used only on the core's worker (the device owner).
`take()` hands the cache to one generation and leaves the holder empty until `put()` returns it,
so two generations can never write the same cache; a generation that fails, or a job that never
puts it back, simply leaves the next turn to start cold. The keys/values of a token prefix depend
only on the weights, so any job that uses the model may overwrite the entry; none can corrupt it.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class CachedPrefix:
    cache: object  # the model's KVCache
    ids: list[int]  # token ids at positions 0..len(ids)-1 of `cache`; positions past it are garbage


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    """Holds at most one KV cache and the ids it holds, for one model."""

    def __init__(self) -> None:
        self._entry: CachedPrefix | None = None
        self._lock = threading.Lock()
        self.hits = 0  # generations that reused at least one position
        self.reused_tokens = 0  # positions not prefilled again, all generations together

    def take(self, device: torch.device, dtype: torch.dtype) -> CachedPrefix | None:
        """The cached entry, now owned by the caller (the holder is left empty)."""
        with self._lock:
            entry, self._entry = self._entry, None
        layer0 = entry.cache.k[0] if entry is not None else None
        if layer0 is None or layer0.device != device or layer0.dtype != dtype:
            return None  # the model moved or changed dtype since: start cold
        return entry

    def put(self, cache, ids: Sequence[int]) -> None:
        with self._lock:
            self._entry = CachedPrefix(cache, list(ids))

    def clear(self) -> None:
        with self._lock:
            self._entry = None

    def record(self, reused: int) -> None:
        if reused:
            self.hits += 1
            self.reused_tokens += reused


_HOLDERS: "weakref.WeakKeyDictionary[torch.nn.Module, PrefixCache]" = weakref.WeakKeyDictionary()
_HOLDERS_LOCK = threading.Lock()


def prefix_cache_for(model: torch.nn.Module) -> PrefixCache:
    """The PrefixCache of one model object (created on first use; dropped with the model)."""
    with _HOLDERS_LOCK:
        holder = _HOLDERS.get(model)
        if holder is None:
            holder = _HOLDERS[model] = PrefixCache()
        return holder
