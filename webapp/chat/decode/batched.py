"""Chat replies on the core's worker, batched: the executor for a model with a KV cache.

`ChatBatch` is the core's executor for chat on a model with a KV cache (webapp/core/executors.py):
every running reply is a row (a `Sequence`). It runs what the core's worker tells it, step by step:
the prefill passes the scheduler plans for its newcomers (`newcomers()`, plain data; each pass runs
the next chunk of the rows it names, side by side in one pass where the model can), then one decoding
step for every row that is decoding, reading the weights once for all of them, and retires the rows
that finished, failed or were cancelled. Each row keeps its own sampling settings, generator, KV cache
and text decoder, so a reply is the same, token for token, as the same reply generated alone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq

from webapp.chat.decode.generate import Sequence, decode_step
from webapp.chat.decode.pieces import Piece
from webapp.chat.decode.prefill import prefill_step
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.decode.publish import chat_result, publish
from webapp.chat.decode.types import ChatJob, ChatRequest, ChatResult
from webapp.chat.model.loading import LoadedChatModel
from webapp.core.executors import BatchedJobs, Finished, StepReport, Worker
from webapp.core.jobs import CANCELLED, DONE, FAILED
from webapp.core.scheduler import Newcomer
from webapp.core.threads import torch_threads


class ChatBatch(BatchedJobs[ChatRequest, ChatResult]):
    """The batched executor: running replies are rows, stepped together."""

    def __init__(self, loaded: LoadedChatModel, max_rows: int, prefix: PrefixCache) -> None:
        self.loaded, self.max_rows = loaded, max_rows
        # Finished replies' caches, kept for their conversations' next turns under a budget (built at boot).
        self.prefix = prefix
        self._rows: dict[str, tuple[ChatJob, Sequence]] = {}  # in order of admission
        self._errors: dict[str, str] = {}  # this step's failed rows, by job id: retired at its end

    @property
    def rows(self) -> int:
        return len(self._rows)

    def memory_bytes(self) -> int:
        return sum(seq.cache_bytes for _, seq in self._rows.values()) + self.prefix.nbytes

    def admit(self, job: ChatJob) -> None:
        request = job.request
        chat_result(job)
        self._rows[job.id] = (job, Sequence(self.loaded, request.prompt_ids, request.params, self.prefix,
                                            odds=request.odds, forced=request.forced,
                                            forced_odds=request.forced_odds, edit=request.edit,
                                            features=request.features))

    def begin_step(self) -> None:
        self._errors = {}
        for job, seq in self._rows.values():
            if job.cancelled:
                seq.cancel()

    def newcomers(self) -> list[Newcomer]:
        return [Newcomer(job.id, len(seq.todo), seq.chunk) for job, seq in self._rows.values()
                if seq.prefilling and job.id not in self._errors]

    def decoding(self) -> bool:
        return any(seq.decoding for _, seq in self._rows.values())

    def prefill(self, rows: Seq[str], core: Worker) -> StepReport:
        """One prefill pass for these newcomers, their first tokens published at once."""
        report, clock = StepReport(), time.perf_counter()
        newcomers = [self._rows[row] for row in rows]
        report.prefill_tokens = sum(len(seq.next_chunk) for _, seq in newcomers)
        with torch_threads(self.loaded.torch_threads):
            failed = prefill_step(self.loaded.model, [seq for _, seq in newcomers])
        self._errors.update({newcomers[i][0].id: _message(exc) for i, exc in failed.items()})
        clock = _spent(report, "prefill", clock)
        for job, seq in newcomers:  # their first tokens now, not after the decoding pass
            self._publish(job, seq.drain(), core)
        _spent(report, "publish", clock)
        return report

    def step(self, core: Worker) -> StepReport:
        report, errors = StepReport(), self._errors
        rows = list(self._rows.values())
        clock = time.perf_counter()
        decoding_rows = [(job, seq) for job, seq in rows if seq.decoding and job.id not in errors]
        if decoding_rows:
            with torch_threads(self.loaded.torch_threads):
                try:
                    decode_step(self.loaded.model, [seq for _, seq in decoding_rows])
                    report.rows = len(decoding_rows)
                except Exception as exc:  # the step failed for every row in it
                    errors.update({job.id: _message(exc) for job, _ in decoding_rows})
            clock = _spent(report, "decode", clock)
        for job, seq in rows:
            self._publish(job, seq.drain(), core)
            if seq.finished or job.id in errors:
                report.finished.append(self._retire(job, seq, errors.get(job.id), core))
        _spent(report, "publish", clock)
        return report

    def _publish(self, job: ChatJob, pieces: list[Piece], core: Worker) -> None:
        for piece in pieces:
            publish(job, piece, core)

    def _retire(self, job: ChatJob, seq: Sequence, error: str | None, core: Worker) -> Finished:
        del self._rows[job.id]
        publish(job, seq.close(keep=error is None), core)
        if error is not None:
            return Finished(job, FAILED, error)
        return Finished(job, CANCELLED if seq.stop_reason == "cancelled" else DONE)


def _spent(report: StepReport, phase: str, since: float) -> float:
    now = time.perf_counter()
    report.phases[phase] = report.phases.get(phase, 0.0) + now - since
    return now


def _message(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
