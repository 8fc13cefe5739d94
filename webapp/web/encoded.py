"""An answer kept as bytes, plain and gzip-compressed, and a few of them kept by key: what
webapp/web/heavy.py serves again without serialising anything."""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
import threading
from collections.abc import Callable, Hashable
from typing import Any


class Encoded:
    """An answer's bytes, kept: plain, gzip-compressed when a client first takes gzip (a report read once by a
    client that takes none never is), and its entity tag (unquoted)."""

    def __init__(self, body: bytes, etag: str) -> None:
        self.body, self.etag = body, etag
        self._gzipped: bytes | None = None

    @classmethod
    def json(cls, value: Any) -> Encoded:
        body = json.dumps(value, separators=(",", ":")).encode()
        return cls(body, hashlib.blake2b(body, digest_size=16).hexdigest())

    @property
    def gzipped(self) -> bytes:
        if self._gzipped is None:  # two threads at once may both compress: the same bytes, kept once
            self._gzipped = gzip.compress(self.body, compresslevel=6, mtime=0)
        return self._gzipped


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
