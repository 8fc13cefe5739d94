"""The API keys (GLASSBOX_API_KEYS, a file of keys): read at start-up and again when the file changes.
Who a request is, and each API blueprint's check, are in webapp/web/api_auth.py.

The file has one key per line; blank lines and lines starting with # are ignored, and anything after
the key on its line (a name, a note) too. It is read again when it changes, so keys are added and
revoked without a restart. Only sha256 digests of the keys are kept in memory.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
from pathlib import Path

from webapp.config import ConfigError

log = logging.getLogger("glassbox.api")

MIN_KEY_CHARS = 16  # a key is a password a script sends: too short is guessable


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def read_keys(path: Path) -> frozenset[str]:
    """The digests of the keys in `path`. Raises ConfigError naming the file and the line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"GLASSBOX_API_KEYS={path}: cannot read the keys file ({error})") from None
    digests = set()
    for number, line in enumerate(lines, 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words[0]) < MIN_KEY_CHARS:
            raise ConfigError(f"GLASSBOX_API_KEYS={path}, line {number}: a key needs at least {MIN_KEY_CHARS} "
                              "characters (python3 -c 'import secrets; print(secrets.token_urlsafe(32))')")
        digests.add(_digest(words[0]))
    if not digests:
        raise ConfigError(f"GLASSBOX_API_KEYS={path}: no keys in the file (unset the variable to leave the API open)")
    return frozenset(digests)


class ApiKeys:
    """The keys file, read at start-up (a bad file stops it) and again whenever it changes."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp = self._file_stamp()
        self._digests = read_keys(self.path)

    def _file_stamp(self):
        try:
            st = os.stat(self.path)
            return st.st_mtime_ns, st.st_size, st.st_ino
        except OSError:
            return None

    def _current(self) -> frozenset[str]:
        stamp = self._file_stamp()
        with self._lock:
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._digests = read_keys(self.path)
                    log.info("api keys reloaded from %s: %d keys", self.path, len(self._digests))
                except ConfigError as error:
                    # Fail closed: a file that cannot be read admits nobody until it is fixed.
                    self._digests = frozenset()
                    log.error("api keys: %s; refusing every key until the file is fixed", error)
            return self._digests

    def identify(self, key: str) -> str | None:
        """The digest of `key` if it is one of the keys, else None."""
        digest = _digest(key)
        found = None
        for known in self._current():  # compare with every key, found or not
            if hmac.compare_digest(known, digest):
                found = known
        return found


def load(settings) -> ApiKeys | None:
    return ApiKeys(settings.api_keys) if getattr(settings, "api_keys", "") else None
