"""The remote backends and the HTTP of one reply: which base URL takes the next reply, the health checks
of one that failed, and a reader thread per reply that streams its chunks (webapp/chat/decode/remote/)."""

from __future__ import annotations

import http.client
import json
import logging
import queue
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from webapp.chat.decode.remote.wire import entry_bytes, reported_tokens

log = logging.getLogger("glassbox.remote")

SCHEME = "openai:"


class BackendError(Exception):
    """A backend could not take or finish a reply; the message is shown to the user."""


class Refusal(BackendError):
    """The backend answered with a 4xx: the request itself is wrong (bad key, bad model); no retry."""


def parse_backend(spec: str) -> list[str]:
    """'openai:http://a:8000/v1,http://b:8000/v1' -> the base URLs (as the openai client's base_url)."""
    spec = spec.strip()
    if not spec:
        return []
    if not spec.startswith(SCHEME):
        raise ValueError(f"GLASSBOX_CHAT_BACKEND={spec!r}: expected openai:<base url>[,<base url>...]")
    urls = [u.strip().rstrip("/") for u in spec[len(SCHEME):].split(",") if u.strip()]
    if not urls:
        raise ValueError("GLASSBOX_CHAT_BACKEND names no base URL")
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"GLASSBOX_CHAT_BACKEND: {url!r} is not an http(s) URL")
    return urls


def read_key(path: str) -> str:
    """The bearer key for the backends: the first non-blank, non-comment line of the file."""
    if not path:
        return ""
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line.split()[0]
    raise ValueError(f"GLASSBOX_CHAT_BACKEND_KEY_FILE={path}: no key in the file")


class Backends:
    """The base URLs, used in turn; one that failed is skipped for `retry_seconds`, then health-checked.

    How many replies each one runs at once (its slots) is asked once (ask_slots): a backend with its slots
    all taken is tried after those with one free. A llama.cpp server queues what its slots cannot take,
    and llama-cpp-python's ends the running reply when another arrives (its default): the front keeps the
    replies beyond the backends' slots in its own queue, where the page says they are waiting."""

    def __init__(self, urls: list[str], key: str = "", retry_seconds: float = 10.0, check_timeout: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.urls, self.key = list(urls), key
        self.retry_seconds, self.check_timeout, self.clock = retry_seconds, check_timeout, clock
        self._next = 0
        self.slots: dict[str, int | None] = {u: None for u in self.urls}  # None: not known (no cap)
        self._busy: dict[str, int] = {u: 0 for u in self.urls}  # replies streaming from each now
        self._down_until: dict[str, float] = {}
        self._suspect: set[str] = set()  # failed once: checked with GET /models before the next reply
        self._lock = threading.Lock()

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def turn(self) -> list[tuple[str, bool]]:
        """The backends to try for one reply, in turn, those with a free slot first: (url, needs a health
        check first). Those in their back-off are left out."""
        with self._lock:
            start, self._next = self._next, (self._next + 1) % len(self.urls)
            now = self.clock()
            order = self.urls[start:] + self.urls[:start]
            order.sort(key=lambda u: not self._free(u))  # stable: round-robin among the free, then the full
            return [(u, u in self._suspect) for u in order if self._down_until.get(u, 0) <= now]

    def _free(self, url: str) -> bool:
        slots = self.slots[url]
        return slots is None or self._busy[url] < slots

    def streaming(self, url: str, delta: int) -> None:
        """A reply began (+1) or ended (-1) streaming from `url`."""
        with self._lock:
            self._busy[url] += delta

    def capacity(self) -> int | None:
        """Replies all the backends run at once (None: a backend that did not say)."""
        known = [n for n in self.slots.values() if n is not None]
        return sum(known) if len(known) == len(self.slots) else None

    def ask_slots(self, configured: int = 0, window: int = 0) -> None:
        """Each backend's slots: `configured` (GLASSBOX_CHAT_BACKEND_SLOTS) when set, else what the
        backend says: llama.cpp's server its `total_slots` (GET /props, beside /v1), no more than its context
        holds replies of `window` tokens; llama-cpp-python's server one (it ends a running reply when another
        arrives: its /v1/models lists a model "owned_by" "me", with "permissions"); a backend that says
        neither, or does not answer, has no cap."""
        for url in self.urls:
            self.slots[url] = configured or self._said_slots(url, window)

    def _said_slots(self, url: str, window: int) -> int | None:
        root = path_of(url, "").removesuffix("/v1")
        props = self._get_json(url, root + "/props")
        if isinstance(props, dict) and isinstance(props.get("total_slots"), int) and props["total_slots"] > 0:
            # On its default flags llama-server's slots share one cache of n_ctx tokens (kv_unified): replies
            # that together hold more fail mid-reply ("Context size has been exceeded"). A reply may hold the
            # whole window, so no more run at once than n_ctx holds windows (at least one). A server started
            # with --no-kv-unified gives each slot n_ctx of its own: GLASSBOX_CHAT_BACKEND_SLOTS says so.
            settings = props.get("default_generation_settings")
            n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
            slots = int(props["total_slots"])
            if window > 0 and isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0:
                slots = max(1, min(slots, n_ctx // window))
            return slots
        models = self._get_json(url, path_of(url, "/models"))
        listed = models.get("data") if isinstance(models, dict) else None
        if isinstance(listed, list) and listed and all(
                isinstance(m, dict) and m.get("owned_by") == "me" and "permissions" in m for m in listed):
            return 1
        return None

    def _get_json(self, url: str, path: str) -> Any:
        """GET path on url's server -> its JSON (None: no answer, not 200, not JSON)."""
        try:
            conn = connection(url, self.check_timeout)
            try:
                conn.request("GET", path, headers=self.headers())
                response = conn.getresponse()
                body = response.read()
                return json.loads(body) if response.status == 200 else None
            finally:
                conn.close()
        except (OSError, http.client.HTTPException, ValueError):
            return None

    def failed(self, url: str) -> None:
        with self._lock:
            self._down_until[url] = self.clock() + self.retry_seconds
            self._suspect.add(url)

    def ok(self, url: str) -> None:
        with self._lock:
            self._down_until.pop(url, None)
            self._suspect.discard(url)

    def wait_hint(self) -> float:
        """Seconds until the first backend's back-off ends (0: one is usable now)."""
        with self._lock:
            now = self.clock()
            return max(0.0, min(self._down_until.get(u, 0.0) for u in self.urls) - now)

    def healthy(self, url: str) -> bool:
        """GET <url>/models answers 200."""
        try:
            conn = connection(url, self.check_timeout)
            try:
                conn.request("GET", path_of(url, "/models"), headers=self.headers())
                response = conn.getresponse()
                response.read()
                return response.status == 200
            finally:
                conn.close()
        except (OSError, http.client.HTTPException):
            return False


def connection(url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname or "", parts.port, timeout=timeout)


def path_of(url: str, suffix: str) -> str:
    return urllib.parse.urlsplit(url).path.rstrip("/") + suffix


# -- one reply's HTTP, on its own thread ------------------------------------------------------------
@dataclass
class Chunk:
    """What one streamed chunk brought: the text the server wrote (its `delta.content`, the reply as any
    OpenAI client shows it) and, when odds were asked, its tokens as (bytes or None, logprobs entry)."""

    text: str
    tokens: list[tuple[bytes | None, dict[str, Any]]] | None  # None: no logprobs in this chunk


@dataclass
class Event:
    kind: str  # "tokens" (data: Chunk), "count" (the backend's token count), "end" (finish reason), "error"
    data: Any = None


class Reader(threading.Thread):
    """Streams one reply from a backend into `events`; `close()` hangs up."""

    def __init__(self, backends: Backends, body: dict[str, Any], news: threading.Event, *, timeout: float,
                 wait_seconds: float) -> None:
        super().__init__(name="glassbox-remote-reply", daemon=True)
        self.backends, self.body, self.news = backends, body, news
        self.timeout, self.wait_seconds = timeout, wait_seconds
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.closed = threading.Event()
        self.url: str | None = None
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        self.closed.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def put(self, event: Event) -> None:
        self.events.put(event)
        self.news.set()

    def run(self) -> None:
        try:
            self.put(Event("end", self._run()))
        except BackendError as error:
            self.put(Event("error", str(error)))
        except Exception as error:  # never a silent end
            log.exception("remote reply failed")
            self.put(Event("error", f"The chat backend failed: {type(error).__name__}: {error}"))
        finally:
            if self._conn is not None:
                self._conn.close()

    def _run(self) -> str:
        deadline = time.monotonic() + self.wait_seconds
        errors: dict[str, str] = {}
        while not self.closed.is_set():
            for url, check in self.backends.turn():
                if self.closed.is_set():
                    return "cancelled"
                if check and not self.backends.healthy(url):
                    self.backends.failed(url)
                    errors[url] = "GET /models did not answer 200"
                    continue
                try:
                    response = self._open(url)
                except Refusal:
                    raise
                except (BackendError, OSError, http.client.HTTPException) as error:
                    self.backends.failed(url)
                    errors[url] = str(error) or type(error).__name__
                    continue
                self.backends.ok(url)
                self.url = url
                self.backends.streaming(url, +1)
                try:
                    return self._read(response)
                finally:
                    self.backends.streaming(url, -1)
            if time.monotonic() >= deadline:
                said = "; ".join(f"{u}: {e}" for u, e in errors.items()) or "all in back-off after failing"
                raise BackendError(f"No chat backend answered within {self.wait_seconds:g} s ({said}).")
            self.closed.wait(min(0.5, max(0.05, self.backends.wait_hint())))
        return "cancelled"

    def _open(self, url: str) -> http.client.HTTPResponse:
        self._conn = conn = connection(url, self.timeout)
        conn.request("POST", path_of(url, "/chat/completions"), body=json.dumps(self.body).encode(),
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream",
                              **self.backends.headers()})
        response = conn.getresponse()
        if response.status != 200:
            detail = _error_text(response.read())
            conn.close()
            if 400 <= response.status < 500 and response.status not in (408, 429):
                raise Refusal(f"The chat backend {url} refused the reply ({response.status}): {detail}")
            raise BackendError(f"HTTP {response.status}: {detail}")
        return response

    def _read(self, response: http.client.HTTPResponse) -> str:
        url = self.url or ""  # set by _run before it reads
        finish: str | None = None
        try:
            while not self.closed.is_set():
                raw = response.readline()
                if not raw:
                    break
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    if finish is None:  # never a finished reply: llama-cpp-python ends a running one so
                        # when another request arrives (its default --interrupt_requests True)
                        raise BackendError(f"The chat backend {url} ended the reply before it was finished "
                                           "(no finish_reason): it was cut short. A llama-cpp-python server "
                                           "must run with --interrupt_requests False (docs/scaling.md).")
                    return finish
                chunk = json.loads(data)
                if "error" in chunk:
                    raise BackendError(f"The chat backend {url} failed mid-reply: {_error_text(chunk)}")
                counted = reported_tokens(chunk)
                if counted is not None:
                    self.put(Event("count", counted))
                for choice in chunk.get("choices") or []:
                    self._tokens(choice)
                    finish = choice.get("finish_reason") or finish
        except (OSError, http.client.HTTPException, ValueError) as error:
            if self.closed.is_set():
                return "cancelled"
            self.backends.failed(url)
            raise BackendError(f"The chat backend {url} stopped mid-reply "
                               f"({type(error).__name__}: {error or 'connection lost'}).") from None
        if self.closed.is_set():
            return "cancelled"
        if finish is not None:  # a server that ends the stream without [DONE]
            return finish
        self.backends.failed(url)
        raise BackendError(f"The chat backend {url} stopped mid-reply (the stream ended without a finish).")

    def _tokens(self, choice: dict[str, Any]) -> None:
        entries = ((choice.get("logprobs") or {}).get("content")) or []
        text = (choice.get("delta") or {}).get("content") or ""
        if entries:
            self.put(Event("tokens", Chunk(text, [(entry_bytes(e), e) for e in entries])))
        elif text:
            self.put(Event("tokens", Chunk(text, None)))


def _error_text(raw: object) -> str:
    try:
        data: Any = json.loads(raw) if isinstance(raw, (bytes, str)) else raw
        error = data.get("error", data)
        return str(error.get("message", error)) if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError):
        return (raw[:300].decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)[:300]) or "-"


