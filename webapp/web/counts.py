"""What one process counts in memory to keep one client from taking everything: new sessions per address
a minute (webapp/web/security.py), open streams per address and the bulk slots held (webapp/web/streams.py),
the bytes of heavy read answers per address (webapp/web/heavy.py). Each app has one of each
(webapp/web/state.py)."""

from __future__ import annotations

import collections
import threading
import time

from flask import abort

NEW_SESSIONS_FULL = ("Too many new sessions from your address in the last minute. Keep the session cookie "
                     "between requests (a browser does), or wait a minute.")


class NewSessions:
    """At most GLASSBOX_MAX_NEW_SESSIONS_PER_MINUTE new owners per client address: per-browser limits
    assume the browser keeps its cookie, and a script that drops it would otherwise get a fresh
    identity, and fresh quotas, with every request."""

    WINDOW = 60.0
    MAX_ADDRESSES = 10_000  # memory stays bounded whatever addresses arrive

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._seen: dict[str, collections.deque] = {}
        self._lock = threading.Lock()

    def take(self, address: str) -> None:
        if not self.per_minute:
            return
        now = time.monotonic()
        with self._lock:
            if len(self._seen) >= self.MAX_ADDRESSES:
                self._forget(now)
            times = self._seen.setdefault(address, collections.deque())
            while times and now - times[0] > self.WINDOW:
                times.popleft()
            if len(times) >= self.per_minute:
                abort(429, NEW_SESSIONS_FULL)
            times.append(now)

    def _forget(self, now: float) -> None:
        for address in [a for a, t in self._seen.items() if not t or now - t[-1] > self.WINDOW]:
            del self._seen[address]
        if len(self._seen) >= self.MAX_ADDRESSES:  # a flood of live addresses: start over rather than grow
            self._seen.clear()


class ClientStreams:
    """Open streams per client address (as a trusted proxy reports it): one browser, or a script that
    drops its cookie, cannot take every slot from everyone else."""

    WAITING_SECONDS = 10.0  # a refused stream retries every few seconds: seen since then, it still waits

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}
        self._waiting: dict[str, dict[str, float]] = {}  # address -> {stream path: when last refused}
        self._swept_at = 0.0

    def waiting(self, client: str, key: str, now: float | None = None) -> int:
        """Notes that stream `key` of this address was refused for now -> how many of its streams wait."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if now - self._swept_at > self.WAITING_SECONDS:  # addresses that never came back go too
                self._swept_at = now
                for address in list(self._waiting):
                    self._drop_stale(address, now)
            seen = self._waiting.setdefault(client, {})
            seen[key] = now
            self._drop_stale(client, now)
            return len(seen)

    def _drop_stale(self, client: str, now: float) -> None:
        seen = self._waiting[client]
        for key in [k for k, at in seen.items() if now - at > self.WAITING_SECONDS]:
            del seen[key]
        if not seen:
            del self._waiting[client]

    def waiting_addresses(self) -> int:
        with self._lock:
            return len(self._waiting)

    def arrived(self, client: str, key: str) -> None:
        """Stream `key` got its slot: it waits no more."""
        with self._lock:
            seen = self._waiting.get(client)
            if seen is not None:
                seen.pop(key, None)
                if not seen:
                    del self._waiting[client]

    def take(self, client: str, limit: int) -> bool:
        with self._lock:
            if limit and self._open.get(client, 0) >= limit:
                return False
            self._open[client] = self._open.get(client, 0) + 1
            return True

    def held(self, client: str) -> int:
        """How many streams this address holds now."""
        with self._lock:
            return self._open.get(client, 0)

    def give_back(self, client: str) -> None:
        with self._lock:
            left = self._open.get(client, 1) - 1
            if left:
                self._open[client] = left
            else:
                self._open.pop(client, None)


class BulkShare:
    """How many bulk slots (replays, non-streamed /v1 calls, Inside reports being worked out) are held: at most
    GLASSBOX_MAX_BULK_STREAMS. When all are held, a few requests (half as many as there are slots) wait up
    to `wait` seconds for one rather than being refused at once: a script that asks again the moment it is
    refused would otherwise spin, and its refusals cost the replies more than the waits. Few, so the waiting
    threads never take the threads gunicorn keeps for page loads."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.held = 0
        self.waiting = 0

    def take(self, limit: int, wait: float = 0.0) -> bool:
        with self._cond:
            if limit and self.held >= limit and wait > 0 and self.waiting < max(1, limit // 2):
                self.waiting += 1
                try:
                    self._cond.wait_for(lambda: self.held < limit, wait)
                finally:
                    self.waiting -= 1
            if limit and self.held >= limit:  # 0: no share of their own, only GLASSBOX_MAX_STREAMS
                return False
            self.held += 1
            return True

    def give_back(self) -> None:
        with self._cond:
            self.held -= 1
            self._cond.notify()


class OpenStreams:
    """How many stream slots are held, of GLASSBOX_MAX_STREAMS (what /metrics shows as glassbox_open_streams)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def take(self, limit: int, newcomer: bool = True) -> bool:
        """Count one more open stream if fewer than `limit` are open (atomically). The last quarter of the slots
        are kept for newcomers (an address holding none): a few addresses holding sockets open without reading
        cannot take every slot from a fifth person."""
        with self._lock:
            if self.count >= limit or (not newcomer and self.count >= limit - limit // 4):
                return False
            self.count += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self.count -= 1


class HeavyReads:
    """Bytes of heavy read answers (webapp/web/heavy.py) per client address: a bucket that fills at
    GLASSBOX_HEAVY_READ_BYTES_PER_SECOND up to BURST_SECONDS of it. An answer is served while the bucket is
    not empty and takes its whole size, so one answer larger than the bucket is still served, and the
    address then waits until the debt is paid back."""

    BURST_SECONDS = 2.0
    MAX_ADDRESSES = 10_000  # memory stays bounded whatever addresses arrive

    def __init__(self, per_second: int, clock=time.monotonic) -> None:
        self.per_second, self.clock = per_second, clock
        self.burst = per_second * self.BURST_SECONDS
        self._level: dict[str, tuple[float, float]] = {}  # address -> (bytes left, when)
        self._lock = threading.Lock()

    def _left(self, address: str, now: float) -> float:
        level, at = self._level.get(address, (self.burst, now))
        return min(self.burst, level + (now - at) * self.per_second)

    def wait(self, address: str) -> float:
        """Seconds until `address` may be served again (0: now)."""
        if not self.per_second:
            return 0.0
        with self._lock:
            left = self._left(address, self.clock())
        return 0.0 if left > 0 else -left / self.per_second + 1e-3

    def take(self, address: str, n: int) -> None:
        """`address` was sent an answer of `n` bytes."""
        if not self.per_second:
            return
        with self._lock:
            now = self.clock()
            if len(self._level) >= self.MAX_ADDRESSES:
                self._forget(now)
            self._level[address] = (self._left(address, now) - n, now)

    def _forget(self, now: float) -> None:
        for address in [a for a in self._level if self._left(a, now) >= self.burst]:  # as good as new
            del self._level[address]
        if len(self._level) >= self.MAX_ADDRESSES:  # a flood of live addresses: start over rather than grow
            self._level.clear()
