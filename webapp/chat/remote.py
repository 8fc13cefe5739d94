"""Chat replies written by a remote OpenAI-compatible server: the way past one machine (docs/scaling.md).

With GLASSBOX_CHAT_BACKEND=openai:<base url>[,<base url>...] the core's executor for chat is
`RemoteChat` instead of the local decoder: the pages, the history, Stop and the Loop lab stay in this
process; the tokens come from vLLM, llama.cpp's server or another Glassbox's /v1.

How a reply runs: `admit()` starts one reader thread per reply. The reader does the HTTP (a streamed
POST <base>/chat/completions with http.client) and pushes what arrives into the reply's queue; the
core's worker never waits on the network for one reply: each `step()` drains every reply's queue,
publishes the tokens (webapp.chat.batch.publish, as the local decoder does) and retires the replies
that ended. Stop closes that reply's connection (the server sees a closed stream and stops its job).

The prompt: the chat page still builds the prompt with the local chat model's tokenizer and window
(so the budget, the dropped turns and the prompt view work as before); the remote is sent the
conversation's turns as `messages` (read back from those prompt ids, without the local few-shot
examples) and applies its own chat template. Glass-box odds come from `logprobs` (top_logprobs up
to 10): probability = exp(logprob), exact. Another Glassbox also sends each token's rank, probability as
sampled and entropy (exact); OpenAI's API has no such fields, so for vLLM or llama.cpp they are worked
out from the alternatives sent: rank is the token's place among them (None past them), the probability
as sampled is exact for greedy replies and for top_k <= 10, an estimate otherwise, and the entropy is
a lower bound (see `odds_of`). Tokens are mapped to the local tokenizer's ids
by their bytes: exact when the remote uses the same tokenizer (another Glassbox, or the same model
under vLLM); otherwise a remote token is re-tokenized locally, its odds on its first piece.

Several base URLs are used in turn (round-robin). One that fails (refused connection, 5xx, a broken
stream) is skipped for `retry_seconds`; after that it is checked with GET <base>/models before it
takes a reply again. A reply that cannot reach any backend waits up to `wait_seconds` (a backend that
is slow to start) and then fails with a message naming each backend and its error. A backend that
dies mid-reply fails the reply with a clear error; the text received so far is kept.
"""

from __future__ import annotations

import codecs
import http.client
import json
import logging
import math
import queue
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from webapp.chat.batch import ChatRequest, publish
from webapp.chat.generate import GenerationStats, Piece
from webapp.chat.odds import TOP_ALTERNATIVES, TokenOdds
from webapp.core.executors import Finished, StepReport
from webapp.core.jobs import CANCELLED, DONE, FAILED, Job

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
    """The base URLs, used in turn; one that failed is skipped for `retry_seconds`, then health-checked."""

    def __init__(self, urls: list[str], key: str = "", retry_seconds: float = 10.0, check_timeout: float = 2.0,
                 clock=time.monotonic) -> None:
        self.urls, self.key = list(urls), key
        self.retry_seconds, self.check_timeout, self.clock = retry_seconds, check_timeout, clock
        self._next = 0
        self._down_until: dict[str, float] = {}
        self._suspect: set[str] = set()  # failed once: checked with GET /models before the next reply
        self._lock = threading.Lock()

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def turn(self) -> list[tuple[str, bool]]:
        """The backends to try for one reply, in turn: (url, needs a health check first). Those in
        their back-off are left out."""
        with self._lock:
            start, self._next = self._next, (self._next + 1) % len(self.urls)
            now = self.clock()
            order = self.urls[start:] + self.urls[:start]
            return [(u, u in self._suspect) for u in order if self._down_until.get(u, 0) <= now]

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
            return max(0.0, min(self._down_until.get(u, 0) for u in self.urls) - now)

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
    return cls(parts.hostname, parts.port, timeout=timeout)


def path_of(url: str, suffix: str) -> str:
    return urllib.parse.urlsplit(url).path.rstrip("/") + suffix


# -- the conversation and the odds --------------------------------------------------------------
def messages_of(prompt, ids) -> list[dict]:
    """The turns of a prompt built by PromptBuilder (bos, few-shot, turns, assistant start), as OpenAI
    messages; the local few-shot examples are left out (the remote applies its own template)."""
    body = list(ids)[1 + len(prompt.fewshot_ids):]
    if body and body[-1] == prompt.assistant_start:
        body = body[:-1]
    ends = {prompt.user_start: ("user", prompt.user_end), prompt.assistant_start: ("assistant", prompt.assistant_end)}
    messages, i = [], 0
    while i < len(body):
        role, end = ends.get(body[i], (None, None))
        if role is None:
            raise ValueError(f"unexpected token {body[i]} in a chat prompt")
        j = body.index(end, i + 1)
        data = b"".join(prompt.tokenizer.decode_single_token_bytes(t) for t in body[i + 1:j])
        messages.append({"role": role, "content": data.decode("utf-8", errors="replace")})
        i = j + 1
    return messages


def token_bytes(entry: dict) -> bytes:
    """A logprobs entry's bytes (`bytes` when given, else its text)."""
    data = entry.get("bytes")
    return bytes(data) if data is not None else str(entry.get("token", "")).encode()


class TokenMap:
    """Remote tokens -> the local tokenizer's ids, by their bytes."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._ids: dict[bytes, int] | None = None

    def _table(self) -> dict[bytes, int]:
        if self._ids is None:
            ids, t = {}, self.tokenizer
            for i in range(getattr(t, "n_vocab", 0) or 0):
                if t.is_special(i):
                    continue
                try:
                    ids.setdefault(t.decode_single_token_bytes(i), i)
                except (KeyError, ValueError):
                    continue
            self._ids = ids
        return self._ids

    def one(self, data: bytes) -> int | None:
        return self._table().get(data)

    def ids(self, data: bytes) -> list[int]:
        single = self.one(data)
        if single is not None:
            return [single]
        return self.tokenizer.encode_ordinary(data.decode("utf-8", errors="replace")) if data else []


def odds_of(entry: dict, token: int, tokens: TokenMap, temperature: float = 1.0, top_k: int = 0) -> TokenOdds:
    """An OpenAI logprobs entry -> TokenOdds. probability = exp(logprob), exact. Glassbox's own /v1 also
    sends the token's `sampled_probability`, `rank` and `entropy_bits`; other servers do not, and they
    are worked out from the alternatives sent (see `sampled_estimates`, `entropy_estimate`)."""
    chosen = token_bytes(entry)
    top = [(token_bytes(alt), _p(alt.get("logprob"))) for alt in entry.get("top_logprobs") or []]
    rank = entry.get("rank")
    if rank is None:
        rank = next((i + 1 for i, (data, _) in enumerate(top) if data == chosen), None)
    p = _p(entry.get("logprob"))
    q = sampled_estimates([*top, (chosen, p)], temperature, top_k)
    alternatives = []
    for data, alt_p in top:
        alt_id = tokens.one(data)
        if alt_id is not None and len(alternatives) < TOP_ALTERNATIVES:
            alternatives.append((alt_id, alt_p, q.get(data, 0.0)))
    sampled = entry.get("sampled_probability")
    entropy = entry.get("entropy_bits")
    return TokenOdds(token, p, q.get(chosen) if sampled is None else sampled, rank,
                     entropy_estimate([x for _, x in top] or [p]) if entropy is None else entropy,
                     tuple(alternatives))


def sampled_estimates(known: list[tuple[bytes, float | None]], temperature: float, top_k: int) -> dict[bytes, float]:
    """Each known token's probability under the distribution sampled from (temperature, then top-k),
    from the tokens the server reported. Exact for greedy replies and when 0 < top_k <= the tokens
    sent (the cut then falls inside them); otherwise the tail not sent is missing, and the figures are
    a little high."""
    probs: dict[bytes, float] = {}
    for data, p in known:
        if p is not None:
            probs[data] = max(probs.get(data, 0.0), p)
    ranked = sorted(probs.items(), key=lambda kv: -kv[1])
    if not ranked:
        return {}
    if temperature <= 0:
        return {data: 1.0 if i == 0 else 0.0 for i, (data, _) in enumerate(ranked)}
    kept = ranked[:top_k] if top_k > 0 else ranked
    weights = {data: math.exp(math.log(max(p, 1e-300)) / temperature) for data, p in kept}
    total = sum(weights.values())
    return {data: weights.get(data, 0.0) / total for data, _ in ranked}


def entropy_estimate(top: list[float | None]) -> float:
    """Bits, from the most likely tokens sent and the rest of the mass as one lump: a lower bound of the
    model's entropy (the rest is spread over many tokens)."""
    ps = [p for p in top if p]
    rest = max(0.0, 1.0 - sum(ps))
    return -sum(p * math.log2(p) for p in [*ps, rest] if p > 0)


def _p(logprob) -> float | None:
    if logprob is None:
        return None
    return math.exp(max(float(logprob), -1e4))


# -- one reply's HTTP, on its own thread ------------------------------------------------------------
@dataclass
class Event:
    kind: str  # "tokens" (data: list of (bytes, logprobs entry or None)), "end" (finish reason), "error"
    data: object = None


class Reader(threading.Thread):
    """Streams one reply from a backend into `events`; `close()` hangs up."""

    def __init__(self, backends: Backends, body: dict, news: threading.Event, *, timeout: float,
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
                return self._read(response)
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
        finish = None
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
                    return finish or "stop"
                chunk = json.loads(data)
                if "error" in chunk:
                    raise BackendError(f"The chat backend {self.url} failed mid-reply: {_error_text(chunk)}")
                for choice in chunk.get("choices") or []:
                    self._tokens(choice)
                    finish = choice.get("finish_reason") or finish
        except (OSError, http.client.HTTPException, ValueError) as error:
            if self.closed.is_set():
                return "cancelled"
            self.backends.failed(self.url)
            raise BackendError(f"The chat backend {self.url} stopped mid-reply "
                               f"({type(error).__name__}: {error or 'connection lost'}).") from None
        if self.closed.is_set():
            return "cancelled"
        if finish is not None:  # a server that ends the stream without [DONE]
            return finish
        self.backends.failed(self.url)
        raise BackendError(f"The chat backend {self.url} stopped mid-reply (the stream ended without a finish).")

    def _tokens(self, choice: dict) -> None:
        entries = ((choice.get("logprobs") or {}).get("content")) or []
        if entries:
            self.put(Event("tokens", [(token_bytes(e), e) for e in entries]))
        else:
            text = (choice.get("delta") or {}).get("content") or ""
            if text:
                self.put(Event("tokens", [(text.encode(), None)]))


def _error_text(raw) -> str:
    try:
        data = json.loads(raw) if isinstance(raw, (bytes, str)) else raw
        error = data.get("error", data)
        return str(error.get("message", error)) if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError):
        return (raw[:300].decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)[:300]) or "-"


# -- the core's executor ------------------------------------------------------------------------------
@dataclass
class Row:
    job: Job
    reader: Reader
    started: float
    decoder: codecs.IncrementalDecoder
    tokens: int = 0


class RemoteChat:
    """The core's executor for chat when the replies are written by remote servers (batched: every
    running reply is a row; a step publishes what arrived and never waits on one reply)."""

    batched = True

    def __init__(self, loaded, backends: Backends, *, model: str = "", max_rows: int = 64, timeout: float = 60.0,
                 wait_seconds: float = 30.0, idle_wait: float = 0.02) -> None:
        self.loaded, self.backends, self.model, self.max_rows = loaded, backends, model, max_rows
        self.timeout, self.wait_seconds, self.idle_wait = timeout, wait_seconds, idle_wait
        self.tokens = TokenMap(loaded.tokenizer)
        self.news = threading.Event()
        self._rows: dict[str, Row] = {}

    @property
    def rows(self) -> int:
        return len(self._rows)

    def memory_bytes(self) -> int:
        return 0

    def body(self, request: ChatRequest) -> dict:
        p = request.params
        body = {"messages": messages_of(self.loaded.prompt, request.prompt_ids),
                "max_tokens": p.max_new_tokens, "temperature": p.temperature, "stream": True}
        if self.model:  # empty: the server's own (Glassbox, llama.cpp and vLLM serving one model take none)
            body["model"] = self.model
        if p.top_k:
            body["top_k"] = p.top_k  # vLLM, llama.cpp and Glassbox take it; others ignore it
        if p.seed is not None:
            body["seed"] = p.seed
        if request.odds:
            body.update(logprobs=True, top_logprobs=TOP_ALTERNATIVES)
        return body

    def admit(self, job: Job) -> None:
        request: ChatRequest = job.request
        if request.forced:
            raise ValueError("Branching from a token is not available when replies come from a remote backend.")
        job.result.update(text=[], token_ids=[], odds=[])
        reader = Reader(self.backends, self.body(request), self.news, timeout=self.timeout,
                        wait_seconds=self.wait_seconds)
        self._rows[job.id] = Row(job, reader, time.perf_counter(), codecs.getincrementaldecoder("utf-8")("replace"))
        reader.start()

    def step(self, core) -> StepReport:
        report = StepReport()
        if not self.news.wait(self.idle_wait):  # nothing arrived: a short wait, not a busy loop
            if not any(row.job.cancelled for row in self._rows.values()):
                return report
        self.news.clear()
        for row in list(self._rows.values()):
            if row.job.cancelled:
                row.reader.close()
                report.finished.append(self._retire(row, CANCELLED, None, core))
                continue
            ended = None
            while ended is None:
                try:
                    event = row.reader.events.get_nowait()
                except queue.Empty:
                    break
                if event.kind == "tokens":
                    for data, entry in event.data:
                        self._publish(row, data, entry, core)
                    report.rows += 1
                elif event.kind == "error":
                    ended = (FAILED, event.data)
                else:
                    ended = (CANCELLED, None) if event.data == "cancelled" else (DONE, None)
            if ended is not None:
                report.finished.append(self._retire(row, *ended, core))
        return report

    def _publish(self, row: Row, data: bytes, entry: dict | None, core) -> None:
        ids = self.tokens.ids(data) or []
        text = row.decoder.decode(data)
        for n, token in enumerate(ids):
            row.tokens += 1
            p = row.job.request.params
            odds = (odds_of(entry, token, self.tokens, p.temperature, p.top_k) if entry is not None and n == 0
                    else TokenOdds.given(token))
            publish(row.job, Piece(text if n == len(ids) - 1 else "", row.tokens,
                                   time.perf_counter() - row.started, token=token, odds=odds), core)
        if not ids and text:
            publish(row.job, Piece(text, row.tokens, time.perf_counter() - row.started), core)

    def _retire(self, row: Row, outcome: str, error: str | None, core) -> Finished:
        del self._rows[row.job.id]
        rest = row.decoder.decode(b"", final=True)
        elapsed = time.perf_counter() - row.started
        first = row.job.result.get("first")
        rate = None
        if first is not None and row.tokens > 1 and elapsed > first:
            rate = (row.tokens - 1) / (elapsed - first)
        publish(row.job, Piece(rest, row.tokens, elapsed,
                               stats=GenerationStats(len(row.job.request.prompt_ids), row.tokens, first, elapsed,
                                                     rate, outcome, False)), core)
        if outcome == FAILED:
            log.warning("remote reply %s failed: %s", row.job.id, error)
        return Finished(row.job, outcome, error)

    def close(self) -> None:
        for row in self._rows.values():
            row.reader.close()


def remote_executor(loaded, settings) -> RemoteChat:
    backends = Backends(parse_backend(settings.chat_backend), read_key(settings.chat_backend_key_file),
                        retry_seconds=settings.chat_backend_retry_seconds)
    return RemoteChat(loaded, backends, model=settings.chat_backend_model, max_rows=settings.chat_backend_max_replies,
                      timeout=settings.chat_backend_timeout, wait_seconds=settings.chat_backend_wait_seconds)
