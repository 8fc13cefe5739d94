"""What a model's sparse dictionaries read in the residual stream: each dictionary's active features at one
position, strongest first. Written once for a reply as it is written (every token's, from the stream its decode
step computed anyway: webapp/chat/model/gpt.py `taps`; ReplyReader) and for a token read again later
(webapp/chat/features/jobs.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from webapp.chat.model import kernels

TOP_FEATURES = 32  # active features kept per dictionary and position, strongest first
# A reply's tapped streams are encoded this many tokens at a time: one product of many rows reads the encoder's
# weights once for all of them, where a row a step would read them every step (docs/benchmarks.md).
READ_EVERY = 32
DIGITS = 5  # decimals an activation is kept to (saved with the reply): well inside float32's noise

Streams = Mapping[int, torch.Tensor]  # block L -> the residual stream after it, one row per position

log = logging.getLogger("glassbox")


@dataclass(frozen=True)
class Reading:
    dictionary: str
    hook_name: str
    features: tuple[tuple[int, float], ...]  # (feature, activation), strongest first, active ones only
    fingerprint: str = ""  # the dictionary's (LoadedDictionary.fingerprint)


class ReplyReader:
    """The readings of a reply's tokens as it is written: each sampled token's streams, as its decode step tapped
    them, held until READ_EVERY are waiting, then encoded together; a token given rather than sampled reads
    nothing (None). No dictionaries: nothing tapped, nothing read."""

    def __init__(self, dictionaries: Mapping[str, Any]) -> None:
        self.dictionaries = dict(dictionaries)
        self.blocks = blocks_read(self.dictionaries.values())  # what the forward taps for this reply
        self.found: list[tuple[Reading, ...] | None] = []  # one per reply token
        self.waiting: list[tuple[int, Streams]] = []  # (token, its streams (1, C)) not encoded yet

    def add(self, streams: Streams | None) -> None:
        """The reply's next token, with the streams where it was sampled (None: given, or nothing tapped)."""
        self.found.append(None)
        if streams is not None and self.dictionaries:
            self.waiting.append((len(self.found) - 1, streams))
            if len(self.waiting) >= READ_EVERY:
                self.flush()

    def flush(self) -> None:
        """Encode the waiting tokens. Features are an extra: one that cannot be read (a dictionary failing) is
        logged and left unread (a job reads it when asked), never the reply's failure."""
        waiting, self.waiting = self.waiting, []
        if not waiting:
            return
        try:
            rows = {block: torch.cat([s[block] for _, s in waiting]) for block in self.blocks}  # (n, C) each
            for (token, _), row in zip(waiting, read(self.dictionaries.values(), rows)):
                self.found[token] = row
        except Exception:
            log.exception("reading %d tokens' features failed; they are left unread", len(waiting))

    def readings(self) -> list[tuple[Reading, ...] | None] | None:
        """Every token's readings so far, one per reply token (None: no dictionaries)."""
        self.flush()
        return self.found if self.dictionaries else None


def blocks_read(dictionaries: Iterable[Any]) -> frozenset[int]:
    """The blocks after which the dictionaries read the stream (LoadedDictionary.layer)."""
    return frozenset(d.layer for d in dictionaries)


@torch.inference_mode()
def read(dictionaries: Iterable[Any], streams: Streams) -> list[tuple[Reading, ...]]:
    """streams: block L -> the stream after it (N, C), one row per position -> each row's readings, one per
    dictionary (LoadedDictionary: name, hook_name, layer, sae). One encode and one copy to the host per
    dictionary for all rows."""
    per_row: list[list[Reading]] | None = None
    for d in dictionaries:
        stream = streams[d.layer]
        values, indices = d.sae.strongest(pre_activations(d, stream.float()), TOP_FEATURES)  # (N, TOP) each
        active = (values > 0).sum(-1).tolist()  # largest first: a row's active features are its first ones
        values, indices = (torch.round(values * 10**DIGITS) / 10**DIGITS).tolist(), indices.tolist()
        if per_row is None:
            per_row = [[] for _ in values]
        for row, n, vs, ids in zip(per_row, active, values, indices):
            row.append(Reading(d.name, d.hook_name, tuple(zip(ids[:n], vs[:n])), d.fingerprint))
    return [tuple(row) for row in per_row or []]


def pre_activations(d: Any, x: torch.Tensor) -> torch.Tensor:
    """A dictionary's pre-activations of a few rows (N, d_in) -> (N, d_sae): one call of the decode kernel where
    it runs (a decode step's few rows read the encoder's weights once, at the machine's bandwidth)."""
    weight, bias = d.encoder  # LoadedDictionary.encoder
    if kernels.supports(x, weight):
        return kernels.linear(x, weight, bias)
    return F.linear(x, weight, bias)


def saved(tokens: list[tuple[Reading, ...] | None]) -> dict[str, Any] | None:
    """A reply's readings as saved with it (compact JSON), None when no token has any: {"dictionaries": {name:
    fingerprint}, "tokens": [{name: [feature, activation, feature, activation, ...]} or null, one per token]}."""
    made = {r.dictionary: r.fingerprint for row in tokens if row is not None for r in row}
    if not made:
        return None
    return {"dictionaries": made,
            "tokens": [None if row is None else {r.dictionary: [x for pair in r.features for x in pair] for r in row}
                       for row in tokens]}


def fired(column: object, dictionary: str, fingerprint: str, feature: int) -> list[tuple[int, float]]:
    """(token, activation) for each token of a saved reply (saved()) where `feature` of this dictionary, as it is
    now (its fingerprint), was among the strongest read."""
    if not isinstance(column, dict) or not isinstance(column.get("dictionaries"), dict):
        return []
    if column["dictionaries"].get(dictionary) != fingerprint or not isinstance(column.get("tokens"), list):
        return []
    found = []
    for token, row in enumerate(column["tokens"]):
        flat = row.get(dictionary) if isinstance(row, dict) else None
        if isinstance(flat, list) and feature in flat[0::2]:
            at = flat[0::2].index(feature) * 2
            if at + 1 < len(flat) and isinstance(flat[at + 1], (int, float)):
                found.append((token, float(flat[at + 1])))
    return found


def saved_reading(column: object, index: int, dictionaries: Mapping[str, Any]) -> tuple[Reading, ...] | None:
    """Token `index`'s readings as saved (saved()), for the dictionaries loaded now, in their order; None when
    not saved, or not by every one of these dictionaries as they are now (one retrained since reads anew)."""
    if not isinstance(column, dict) or not isinstance(column.get("tokens"), list):
        return None
    made, tokens = column.get("dictionaries") or {}, column["tokens"]
    row = tokens[index] if 0 <= index < len(tokens) else None
    if not isinstance(row, dict) or not isinstance(made, dict):
        return None
    readings = []
    for name, d in dictionaries.items():
        flat = row.get(name)
        if made.get(name) != d.fingerprint or not isinstance(flat, list) or len(flat) % 2:
            return None
        try:
            pairs = tuple((int(flat[i]), float(flat[i + 1])) for i in range(0, len(flat), 2))
        except (TypeError, ValueError):  # a row changed by hand or by a disk: read it again instead
            return None
        readings.append(Reading(name, d.hook_name, pairs, d.fingerprint))
    return tuple(readings)
