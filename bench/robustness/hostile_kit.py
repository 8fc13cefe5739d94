"""What bench.robustness.hostile and its attacks one at a time (hostile_attacks.py, hostile_each.py) share: the
good user whose experience is measured, the tallies, raw sockets, and the server's limits during the run."""

from __future__ import annotations

import collections
import http.client
import re
import socket
import threading
import time
import urllib.parse

from tests.support.servers import Client, stream_url

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


PREFIX = "/glassbox"


BUSY = ("Too many open streams", "busy", "queue", "shutting down", "try again")


LIMITS = {"GLASSBOX_MAX_STREAMS": "24", "GLASSBOX_THREADS": "32", "GLASSBOX_MAX_TRACES": "20",
          "GLASSBOX_MAX_CONVERSATIONS": "20", "GLASSBOX_MAX_STORED_BYTES": str(2 * 2**20)}


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


class Tally:
    """Every status every attacker and the good user got, and each 5xx with its body."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.codes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.bad: list[str] = []

    def add(self, who: str, status: int, body: bytes | str = b"", what: str = "") -> None:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        with self.lock:
            self.codes[who][status] += 1
            if status >= 500 and not (status == 503 and any(b.lower() in text.lower() for b in BUSY)):
                title = re.search(r"<title>([^<]*)</title>", text)
                self.bad.append(f"{who} {what}: {status} "
                                + (title.group(1) if title else " ".join(text.split())[:120]))


class Raw:
    """HTTP/1.1 from a chosen loopback address, cookies kept by hand (or not at all)."""

    def __init__(self, base: str, source: str, keep_cookie: bool = True) -> None:
        parts = urllib.parse.urlsplit(base)
        self.host, self.port, self.prefix, self.source = parts.hostname, parts.port, parts.path, source
        self.keep_cookie, self.cookie, self.csrf = keep_cookie, "", ""

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float = 15) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout, source_address=(self.source, 0))
        hdrs = {"Cookie": self.cookie} if self.cookie else {}
        if self.csrf and method != "GET":
            hdrs["X-CSRF-Token"] = self.csrf
        hdrs.update(headers or {})
        try:
            conn.request(method, self.prefix + path, body=body, headers=hdrs)
            response = conn.getresponse()
            data = response.read()
            if self.keep_cookie:
                for name, value in response.getheaders():
                    if name.lower() == "set-cookie" and value.startswith("glassbox_session="):
                        self.cookie = value.split(";", 1)[0]
            token = re.search(rb'name="csrf_token" value="([^"]+)"', data)
            if token:
                self.csrf = token.group(1).decode()
            return response.status, dict(response.getheaders()), data
        finally:
            conn.close()

    def form(self, path: str, fields: dict, **kw):
        return self.request("POST", path, urllib.parse.urlencode(fields, doseq=True).encode(),
                            {"Content-Type": "application/x-www-form-urlencoded", **kw.pop("headers", {})}, **kw)

    def hold(self, path: str, method: str = "GET", body: bytes | None = None,
             headers: dict | None = None) -> socket.socket:
        """Send a request and never read the answer: the socket is returned to be closed later."""
        sock = socket.create_connection((self.host, self.port), timeout=10, source_address=(self.source, 0))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host}:{self.port}",
                 "Accept: text/event-stream"]
        if self.cookie:
            lines.append(f"Cookie: {self.cookie}")
        for k, v in (headers or {}).items():
            lines.append(f"{k}: {v}")
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
        return sock


def mapping(shift: int) -> list[list[str]]:
    return [[a, LETTERS[(i + shift) % 26]] for i, a in enumerate(LETTERS)]


class GoodUser:
    """A colleague on 127.0.0.1: pages, a chat reply at a time, a Loop-lab run at a time."""

    def __init__(self, base: str, tally: Tally) -> None:
        self.client = Client(base)
        self.tally = tally
        self.pages: list[float] = []
        self.ttft: list[float] = []
        self.reply_s: list[float] = []
        self.loop_s: list[float] = []
        self.retries = self.refused = 0
        self.until = float("inf")

    def page(self, path: str) -> None:
        started = time.monotonic()
        reply = self.client.get(path)
        self.tally.add("good user", reply.status, reply.text, path)
        if reply.status == 200:
            self.pages.append(time.monotonic() - started)

    def chat(self, tokens: int) -> None:
        started = time.monotonic()
        reply = self.client.post("/chat/send", {"content": "What is the capital of France?",
                                                "max_new_tokens": str(tokens)}, htmx=True)
        self.tally.add("good user", reply.status, reply.text, "send")
        if reply.status != 200:
            self.refused += 1
            time.sleep(0.5)
            return
        stream = self.open(stream_url(reply.text), "chat stream")
        if stream is None:
            return
        first = None
        for event in stream.events():
            if event.name == "token" and first is None:
                first = event.at - started
            if event.name == "done" or time.monotonic() > self.until:
                break
        stream.close()
        if first is not None:
            self.ttft.append(first)
            self.reply_s.append(time.monotonic() - started)

    def open(self, url: str, what: str, patience: float = 30.0):
        """The stream, as EventSource gets it: a 503 (no stream free) is retried after a moment."""
        deadline = min(time.monotonic() + patience, self.until)
        while True:
            stream = self.client.open_stream(url, timeout=60)
            body = b"" if stream.status == 200 else stream.response.read()
            self.tally.add("good user", stream.status, body, what)
            if stream.status == 200:
                return stream
            stream.close()
            if stream.status != 503 or time.monotonic() > deadline:
                self.refused += 1
                return None
            self.retries += 1
            time.sleep(0.5)

    def loops(self) -> None:
        started = time.monotonic()
        lab = self.client.get("/loops/")
        src = re.findall(r'name="src" value="([A-Z])"', lab.text)
        reply = self.client.post("/loops/run", {"src": src, "dst": src[1:] + src[:1], "start": "A", "steps": "12"},
                                 htmx=True)
        self.tally.add("good user", reply.status, reply.text, "loop run")
        if reply.status != 200:
            self.refused += 1
            time.sleep(0.5)
            return
        stream = self.open(stream_url(reply.text), "loop stream")
        if stream is None:
            return
        done = False
        for event in stream.events():
            done = event.name == "done"
            if done or time.monotonic() > self.until:
                break
        stream.close()
        if done:  # a run cut short by the time bound is not a run's duration
            self.loop_s.append(time.monotonic() - started)

    def session(self, until: float, tokens: int) -> None:
        self.until = until + 20  # a reply or a run in progress may finish a little after, not long after
        self.page("/")
        while time.monotonic() < until:
            for path in ("/", "/chat/", "/loops/"):
                self.page(path)
            self.chat(tokens)
            self.page("/chat/")
            self.loops()
