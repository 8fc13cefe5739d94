"""The attacks of issue 25, each one way a hostile client can press on the app, for bench.robustness.hostile
--each (hostile_each.py runs them one at a time): concurrent writers (8 browsers sending every second),
regenerators (4 browsers regenerating), the editor flood (8 concurrent POST /loops/editor with 10,000 pairs),
paced-replay slot hogs (4 addresses x 6 replays of a 256-row trace), non-streamed /v1 slot hogs (8 addresses x 4
long completions), /v1 bodies over the limit on kept-alive connections, and slow clients (slow headers, slow
bodies, idle connections). Each attacker has its own loopback address; every load is bounded in count and time,
loopback only.
"""

from __future__ import annotations

import collections
import http.client
import json
import re
import socket
import threading
import urllib.parse
from collections.abc import Callable

from bench.robustness.hostile_kit import LETTERS, Raw, Tally, mapping

V1_TOKENS = 480         # a long non-streamed completion: the tiny test model's window is 512


def address(group: int, n: int) -> str:
    return f"127.0.{group}.{n + 1}"


def paced_trace(steps: int) -> bytes:
    """A trace file whose loops arrived a second apart: its replay runs the longest a replay may."""
    rows = [{"loop": n, "prediction": "B", "direct_prediction": None, "stop_probability": 0.0,
             "top3": [{"symbol": "B", "probability": 0.9}], "arrival_seconds": float(n)} for n in range(1, steps + 1)]
    return json.dumps({"schema_version": 1, "request": {"mapping": mapping(1), "start": "A", "steps": steps},
                       "trace": rows, "summary": {"stop_reason": "cap"}}).encode()


def multipart(raw: Raw, field: str, content: bytes) -> tuple[bytes, dict]:
    boundary = "glassboxhostile"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"csrf_token\"\r\n\r\n{raw.csrf}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"t.json\"\r\n"
            f"Content-Type: application/json\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


class Attacks:
    """Each method runs one attack until `stop` is set; `threads` says how many run it at once."""

    def __init__(self, base: str, tally: Tally, stop: threading.Event) -> None:
        self.base, self.tally, self.stop = base, tally, stop
        self.prefix = urllib.parse.urlsplit(base).path
        self.held: list[socket.socket] = []
        self.lock = threading.Lock()
        self.counts: collections.Counter = collections.Counter()

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] += n

    def local(self, url: str) -> str:
        return url[len(self.prefix):] if self.prefix and url.startswith(self.prefix) else url

    def safely(self, who: str, call: Callable[[], tuple[int, dict, bytes]], what: str) -> tuple[int, bytes]:
        try:
            status, _, body = call()
        except (OSError, http.client.HTTPException) as error:
            self.count(f"{who}: connection errors ({type(error).__name__})")
            self.stop.wait(0.2)
            return 0, b""
        self.tally.add(who, status, body, what)
        if status >= 400 and status != 413:
            self.stop.wait(0.25)  # refused: a moment before the next try, as a client library backs off
        return status, body

    # -- the attacks -------------------------------------------------------------------------
    def writers(self, n: int) -> None:
        """One of 8 browsers, each sending a short message every second into its own conversation."""
        raw = Raw(self.base, address(11, n))
        self.safely("writers", lambda: raw.request("GET", "/chat/"), "page")
        conversation, k = "", 0
        while not self.stop.is_set():
            k += 1
            fields = {"content": f"message {k}", "max_new_tokens": "8", "conversation_id": conversation}
            status, body = self.safely(
                "writers", lambda f=fields: raw.form("/chat/send", f, headers={"HX-Request": "true"}), "send")
            found = re.search(rb'name="conversation_id" value="([0-9a-f]+)"', body)
            conversation = found.group(1).decode() if found else conversation
            self.count("writers: sends")
            self.stop.wait(1.0)

    def regenerators(self, n: int) -> None:
        """One of 4 browsers regenerating the last reply of its conversation again and again."""
        raw = Raw(self.base, address(12, n))
        self.safely("regenerators", lambda: raw.request("GET", "/chat/"), "page")
        _, body = self.safely("regenerators", lambda: raw.form(
            "/chat/send", {"content": "Hello!", "max_new_tokens": "8"}, headers={"HX-Request": "true"}), "send")
        found = re.search(rb'name="conversation_id" value="([0-9a-f]+)"', body)
        if not found:
            return
        url = f"/chat/c/{found.group(1).decode()}/regenerate"
        while not self.stop.is_set():
            self.safely("regenerators", lambda: raw.form(url, {"max_new_tokens": "8"}, headers={"HX-Request": "true"}),
                        "regenerate")
            self.count("regenerators: regenerations")
            self.stop.wait(0.1)

    def editor(self, n: int) -> None:
        """One of 8 concurrent editor posts of 10,000 src/dst pairs (~200 KB), from one address."""
        raw = Raw(self.base, address(13, 0))
        self.safely("editor", lambda: raw.request("GET", "/loops/"), "page")
        fields = {"src": [LETTERS[i % 26] for i in range(10_000)],
                  "dst": [LETTERS[(i + 1) % 26] for i in range(10_000)],
                  "start": "A", "steps": "8", "action": "shuffle"}
        while not self.stop.is_set():
            self.safely("editor", lambda: raw.form("/loops/editor", fields, headers={"HX-Request": "true"}, timeout=30),
                        "editor flood")
            self.count("editor: posts")

    def replays(self, n: int) -> None:
        """One of 4 addresses holding 6 paced replays of a 256-row trace open, never read."""
        raw = Raw(self.base, address(14, n))
        self.safely("replays", lambda: raw.request("GET", "/loops/"), "page")
        body, headers = multipart(raw, "trace", paced_trace(256))
        try:
            status, answer_headers, answer = raw.request("POST", "/loops/traces/upload", body, headers)
        except OSError:
            status, answer_headers, answer = 0, {}, b""
        self.tally.add("replays", status, answer, "upload")
        found = re.search(r"/loops/traces/([^/?#\"]+)", answer_headers.get("Location", ""))
        trace = found.group(1) if found else None
        if not trace:
            self.count("replays: no trace to replay")
            return
        mine: list[socket.socket] = []
        while not self.stop.is_set():
            try:
                mine.append(raw.hold(f"/loops/traces/{trace}/replay"))
                self.count("replays: opened")
            except OSError:
                self.count("replays: connection errors")
            while len(mine) > 6:
                mine.pop(0).close()
            self.stop.wait(0.5)
        for sock in mine:
            sock.close()

    def v1_hogs(self, n: int) -> None:
        """One of 32 (8 addresses x 4) long non-streamed /v1 completions, one after another."""
        raw = Raw(self.base, address(15, n // 4), keep_cookie=False)
        body = json.dumps({"model": "glassbox", "prompt": "hi", "max_tokens": V1_TOKENS}).encode()
        while not self.stop.is_set():
            self.safely("v1 hogs", lambda: raw.request("POST", "/v1/completions", body,
                                                       {"Content-Type": "application/json"}, timeout=120),
                        "/v1/completions")
            self.count("v1 hogs: completions")

    def bodies_413(self, n: int) -> None:
        """/v1 bodies over the limit on a kept-alive connection, then a small request on the same one."""
        parts = urllib.parse.urlsplit(self.base)
        big = json.dumps({"model": "glassbox", "messages": [{"role": "user", "content": "x" * 300_000}]}).encode()
        conn = None
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=15,
                                                      source_address=(address(16, n), 0))
                conn.request("POST", self.prefix + "/v1/chat/completions", body=big,
                             headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                self.tally.add("413 bodies", response.status, response.read(), "oversized /v1 body")
                conn.request("GET", self.prefix + "/v1/models")
                response = conn.getresponse()
                self.tally.add("413 bodies", response.status, response.read(), "next request, same connection")
                self.count("413 bodies: pairs sent")
                if response.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException):
                self.count("413 bodies: connection closed under the next request")
                if conn is not None:
                    conn.close()
                conn = None
            self.stop.wait(0.1)
        if conn is not None:
            conn.close()

    def slow_clients(self, n: int) -> None:
        """33 slow-header, 40 slow-body and 100 idle connections, kept up; a byte more every 2 s."""
        parts = urllib.parse.urlsplit(self.base)
        kinds = {"slow headers": 33, "slow bodies": 40, "idle": 100}
        socks: dict[str, list[socket.socket]] = {k: [] for k in kinds}
        while not self.stop.is_set():
            for kind, want in kinds.items():
                while len(socks[kind]) < want and not self.stop.is_set():
                    try:
                        s = socket.create_connection((parts.hostname, parts.port), timeout=5,
                                                     source_address=(address(17, 0), 0))
                        if kind == "slow headers":
                            s.sendall(f"GET {self.prefix}/chat/ HTTP/1.1\r\nHost: x\r\n".encode())
                        elif kind == "slow bodies":
                            s.sendall(f"POST {self.prefix}/chat/send HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                      "application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\n".encode())
                        socks[kind].append(s)
                        self.count(f"slow clients: {kind} opened")
                    except OSError:
                        self.count("slow clients: refused connections")
                        break
            for kind in ("slow headers", "slow bodies"):
                for s in list(socks[kind]):
                    try:
                        s.sendall(b"X-a: b\r\n" if kind == "slow headers" else b"a")
                    except OSError:
                        socks[kind].remove(s)
                        s.close()
            self.stop.wait(2.0)
        for group in socks.values():
            for s in group:
                s.close()


# name -> (method, threads)
ATTACKS: dict[str, tuple[str, int]] = {
    "concurrent writers (8 browsers, a send a second)": ("writers", 8),
    "regenerators (4 browsers)": ("regenerators", 4),
    "editor flood (8 x 10,000 pairs)": ("editor", 8),
    "paced replays (4 addresses x 6)": ("replays", 4),
    "non-streamed /v1 (8 addresses x 4)": ("v1_hogs", 32),
    "/v1 413 bodies, kept alive": ("bodies_413", 2),
    "slow clients (33 headers, 40 bodies, 100 idle)": ("slow_clients", 1),
}
