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
under vLLM); otherwise a remote token is re-tokenized locally, its odds on its first piece and
probability 1 on the rest (`continuation`). The reply's text is what the server wrote (`delta.content`);
a token whose bytes the server did not send (part of a character: llama-cpp-python, vLLM) takes the
bytes of the text that came with it, or U+FFFD's when none came (see `_chunk`). The reply's end is the
server's: a stream that ends without a finish_reason fails the reply as cut short, its text kept. So is its
length: the count and tokens/s kept with the reply are the backend's tokens (its usage, else its logprobs
entries: `Row.backend_tokens`), not the local pieces, which a byte-level front has more of.

Several base URLs are used in turn (round-robin). One that fails (refused connection, 5xx, a broken
stream) is skipped for `retry_seconds`; after that it is checked with GET <base>/models before it
takes a reply again. A reply that cannot reach any backend waits up to `wait_seconds` (a backend that
is slow to start) and then fails with a message naming each backend and its error. A backend that
dies mid-reply fails the reply with a clear error; the text received so far is kept.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from webapp.chat.decode.odds import TokenOdds
from webapp.chat.decode.pieces import GenerationStats, Piece
from webapp.chat.decode.publish import chat_result, publish
from webapp.chat.decode.remote.backends import Backends, Chunk, Reader, parse_backend, read_key
from webapp.chat.decode.remote.wire import REPLACEMENT, TokenMap, continuation, odds_of, request_body
from webapp.chat.decode.types import ChatJob, ChatRequest, ChatResult, decode_rate
from webapp.chat.model.loading import LoadedChatModel
from webapp.config import Settings
from webapp.core.executors import BatchedJobs, Finished, StepReport, Worker
from webapp.core.jobs import CANCELLED, DONE, FAILED, JobState

log = logging.getLogger("glassbox.remote")


# -- the core's executor ------------------------------------------------------------------------------
@dataclass
class Row:
    job: ChatJob
    reader: Reader
    started: float
    tokens: int = 0  # local pieces published (the local tokenizer's ids)
    unknown: list[dict[str, Any]] = field(default_factory=list)  # entries whose bytes are still to come
    entries: int = 0  # the backend's tokens seen, one logprobs entry each (when odds were asked)
    reported: int | None = None  # the backend's own count (usage, timings), when it sent one

    def backend_tokens(self) -> int | None:
        """The reply's length in the backend's tokens: what it reported, else its logprobs entries; None when
        it said neither (no odds asked, and a server that sends no usage)."""
        return self.reported if self.reported is not None else self.entries or None


class RemoteChat(BatchedJobs[ChatRequest, ChatResult]):
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

    def admit(self, job: ChatJob) -> None:
        request = job.request
        if request.forced:
            raise ValueError("Branching from a token is not available when replies come from a remote backend.")
        chat_result(job)
        reader = Reader(self.backends, self.body(request), self.news, timeout=self.timeout,
                        wait_seconds=self.wait_seconds)
        self._rows[job.id] = Row(job, reader, time.perf_counter())
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
            ended: tuple[JobState, str | None] | None = None
            while ended is None:
                try:
                    event = row.reader.events.get_nowait()
                except queue.Empty:
                    break
                if event.kind == "tokens":
                    self._chunk(row, event.data, core)
                    report.rows += 1
                elif event.kind == "count":
                    row.reported = event.data
                elif event.kind == "error":
                    ended = (FAILED, event.data)
                else:
                    ended = (CANCELLED, None) if event.data == "cancelled" else (DONE, event.data)
            if ended is not None:
                report.finished.append(self._retire(row, *ended, core))
        return report

    def _chunk(self, row: Row, chunk: Chunk, core: Worker) -> None:
        """One chunk's tokens and text, published as the local tokenizer's tokens, the text on the last.

        A token whose bytes are unknown waits in `row.unknown` for the text that brings its character:
        the chunk's text beyond the bytes of its known tokens (vLLM sends the whole character with the
        token that ends it). When a known token comes first, or the reply ends, without that text, the
        bytes were never sent (llama-cpp-python drops them): those tokens are U+FFFD's."""
        got = chunk.text.encode()
        if chunk.tokens is None:  # no odds asked: the text's local tokens, no odds
            pieces: list[tuple[int, TokenOdds | None]] = [(t, None) for t in self.tokens.ids(got)]
        else:
            row.entries += len(chunk.tokens)
            known = b"".join(data for data, _ in chunk.tokens if data is not None)
            lead = got[:len(got) - len(known)] if got.endswith(known) else b""  # what no known token wrote
            pieces = []
            for data, entry in chunk.tokens:
                if data is None:
                    row.unknown.append(entry)
                    continue
                if row.unknown:
                    pieces += self._resolve(row, lead)
                    lead = b""
                pieces += self._split(row, data, [entry])
            if row.unknown and lead:
                pieces += self._resolve(row, lead)
        self._publish(row, pieces, chunk.text, core)

    def _split(self, row: Row, data: bytes, entries: list[dict[str, Any]]) -> list[tuple[int, TokenOdds | None]]:
        """Remote tokens (their entries) that wrote `data` -> local tokens: each remote token's odds on a
        local token in turn, and probability 1 on local pieces past them (a remote token split locally)."""
        p = row.job.request.params
        ids = self.tokens.ids(data)
        return [(token, odds_of(entries[n], token, self.tokens, p.temperature, p.top_k) if n < len(entries)
                 else continuation(token)) for n, token in enumerate(ids)]

    def _resolve(self, row: Row, data: bytes) -> list[tuple[int, TokenOdds | None]]:
        entries, row.unknown = row.unknown, []
        return self._split(row, data or REPLACEMENT, entries)

    def _publish(self, row: Row, pieces: list[tuple[int, TokenOdds | None]], text: str, core: Worker) -> None:
        for n, (token, odds) in enumerate(pieces):
            row.tokens += 1
            publish(row.job, Piece(text if n == len(pieces) - 1 else "", row.tokens,
                                   time.perf_counter() - row.started, token=token, odds=odds), core)
        if not pieces and text:
            publish(row.job, Piece(text, row.tokens, time.perf_counter() - row.started), core)

    def _retire(self, row: Row, outcome: JobState, detail: str | None, core: Worker) -> Finished:
        """`detail`: the error of a failed reply, the server's finish_reason of a finished one."""
        del self._rows[row.job.id]
        if row.unknown:  # the reply ended before their bytes came
            self._publish(row, self._resolve(row, b""), "", core)
        elapsed = time.perf_counter() - row.started
        first = chat_result(row.job).first_s
        stop = {DONE: "length" if detail == "length" else "end", CANCELLED: "cancelled"}.get(outcome, "failed")
        # the count and the rate in the backend's tokens: a byte-level front splits a BPE token into its bytes
        said = chat_result(row.job).backend_tokens = row.backend_tokens()
        counted = row.tokens if said is None else said  # the local pieces only when the backend said nothing
        publish(row.job, Piece("", row.tokens, elapsed,
                               stats=GenerationStats(len(row.job.request.prompt_ids), counted, first, elapsed,
                                                     decode_rate(counted, first, elapsed), stop, False)), core)
        error = (detail or "The chat backend ended the reply with an error it did not describe.") \
            if outcome == FAILED else None
        if outcome == FAILED:
            log.warning("remote reply %s failed: %s", row.job.id, error)
        return Finished(row.job, outcome, error)

    def close(self) -> None:
        for row in self._rows.values():
            row.reader.close()


def remote_executor(loaded: LoadedChatModel, settings: Settings) -> RemoteChat:
    """The remote chat executor of the settings: as many replies streaming at once as the backends have
    slots (asked now, or GLASSBOX_CHAT_BACKEND_SLOTS each), at most GLASSBOX_CHAT_BACKEND_MAX_REPLIES; the
    rest wait in the core's queue, each page saying how many are ahead."""
    backends = Backends(parse_backend(settings.chat_backend), read_key(settings.chat_backend_key_file),
                        retry_seconds=settings.chat_backend_retry_seconds)
    backends.ask_slots(settings.chat_backend_slots, window=loaded.block_size)
    capacity = backends.capacity()
    rows = settings.chat_backend_max_replies if capacity is None else min(capacity, settings.chat_backend_max_replies)
    log.info("chat backends %s: slots %s, replies at once %d", ", ".join(backends.urls),
             ", ".join("?" if n is None else str(n) for n in backends.slots.values()), rows)
    return RemoteChat(loaded, backends, model=settings.chat_backend_model, max_rows=rows,
                      timeout=settings.chat_backend_timeout, wait_seconds=settings.chat_backend_wait_seconds)
