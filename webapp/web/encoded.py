"""An answer kept as bytes, plain and gzip-compressed, and a few of them kept by key: what
webapp/web/heavy.py serves again without serialising anything."""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Encoded:
    """An answer's bytes, kept: plain and gzip-compressed, and its entity tag (unquoted)."""

    body: bytes
    gzipped: bytes
    etag: str

    @classmethod
    def json(cls, value: Any) -> Encoded:
        body = json.dumps(value, separators=(",", ":")).encode()
        tag = hashlib.blake2b(body, digest_size=16).hexdigest()
        return cls(body, gzip.compress(body, compresslevel=6, mtime=0), tag)


class KeptAnswers:
    """Encoded answers kept under a key (a trace's id), the `keep` most recently used. Whoever asks checks
    first that the asker may see it: the key is what the answer is, not who may read it."""

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._kept: collections.OrderedDict[Hashable, Encoded] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], Encoded]) -> Encoded:
        with self._lock:
            found = self._kept.get(key)
            if found is not None:
                self._kept.move_to_end(key)
                return found
        made = make()
        with self._lock:
            self._kept[key] = made
            while len(self._kept) > self.keep:
                self._kept.popitem(last=False)
        return made
