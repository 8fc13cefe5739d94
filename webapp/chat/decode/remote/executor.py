"""Chat replies written by a remote OpenAI-compatible server: the way past one machine (docs/scaling.md).

With GLASSBOX_CHAT_BACKEND=openai:<base url>[,<base url>...] the core's executor for chat is
`RemoteChat` instead of the local decoder: the pages, the history, Stop and the Loop lab stay in this
process; the tokens come from vLLM, llama.cpp's server or another Glassbox's /v1.

How a reply runs: `admit()` starts one reader thread per reply. The reader does the HTTP (a streamed
POST <base>/chat/completions with http.client) and pushes what arrives into the reply's queue; the
core's worker never waits on the network for one reply: each `step()` drains every reply's queue,
publishes the tokens (webapp/chat/decode/publish.py, as the local decoder does) and retires the replies
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
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from webapp.chat.decode.generate import GenerationStats, Piece
from webapp.chat.decode.odds import TokenOdds
from webapp.chat.decode.publish import chat_result, publish
from webapp.chat.decode.remote.backends import Backends, Reader, parse_backend, read_key
from webapp.chat.decode.remote.wire import TokenMap, odds_of, request_body
from webapp.chat.decode.types import ChatRequest, decode_rate
from webapp.chat.model.loading import LoadedChatModel
from webapp.config import Settings
from webapp.core.executors import BatchedJobs, Finished, StepReport, Worker
from webapp.core.jobs import CANCELLED, DONE, FAILED, Job

log = logging.getLogger("glassbox.remote")


# -- the core's executor ------------------------------------------------------------------------------
@dataclass
class Row:
    job: Job
    reader: Reader
    started: float
    decoder: codecs.IncrementalDecoder
    tokens: int = 0


class RemoteChat(BatchedJobs):
    """The core's executor for chat when the replies are written by remote servers (batched: every
    running reply is a row; a step publishes what arrived and never waits on one reply)."""

    def __init__(self, loaded: LoadedChatModel, backends: Backends, *, model: str = "", max_rows: int = 64,
                 timeout: float = 60.0, wait_seconds: float = 30.0, idle_wait: float = 0.02) -> None:
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

    def body(self, request: ChatRequest) -> dict[str, Any]:
        return request_body(self.loaded.prompt, request, self.model)

    def admit(self, job: Job) -> None:
        request: ChatRequest = job.request
        if request.forced:
            raise ValueError("Branching from a token is not available when replies come from a remote backend.")
        chat_result(job)
        reader = Reader(self.backends, self.body(request), self.news, timeout=self.timeout,
                        wait_seconds=self.wait_seconds)
        self._rows[job.id] = Row(job, reader, time.perf_counter(), codecs.getincrementaldecoder("utf-8")("replace"))
        reader.start()

    def step(self, core: Worker) -> StepReport:
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
            ended: tuple[str, str | None] | None = None
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

    def _publish(self, row: Row, data: bytes, entry: dict[str, Any] | None, core: Worker) -> None:
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

    def _retire(self, row: Row, outcome: str, error: str | None, core: Worker) -> Finished:
        del self._rows[row.job.id]
        rest = row.decoder.decode(b"", final=True)
        elapsed = time.perf_counter() - row.started
        first = chat_result(row.job).first_s
        publish(row.job, Piece(rest, row.tokens, elapsed,
                               stats=GenerationStats(len(row.job.request.prompt_ids), row.tokens, first, elapsed,
                                                     decode_rate(row.tokens, first, elapsed), outcome, False)), core)
        if outcome == FAILED:
            log.warning("remote reply %s failed: %s", row.job.id, error)
        return Finished(row.job, outcome, error)

    def close(self) -> None:
        for row in self._rows.values():
            row.reader.close()


def remote_executor(loaded: LoadedChatModel, settings: Settings) -> RemoteChat:
    backends = Backends(parse_backend(settings.chat_backend), read_key(settings.chat_backend_key_file),
                        retry_seconds=settings.chat_backend_retry_seconds)
    return RemoteChat(loaded, backends, model=settings.chat_backend_model, max_rows=settings.chat_backend_max_replies,
                      timeout=settings.chat_backend_timeout, wait_seconds=settings.chat_backend_wait_seconds)
