"""Chat replies on the core's worker, batched: the executor for a model with a KV cache.

`ChatBatch` is the core's executor for chat on a model with a KV cache (webapp/core/executors.py):
every running reply is a row (a `Sequence`). Each step it retires cancelled rows, runs one prefill
chunk for the oldest newcomer and for the next ones that fit beside it in one chunk's worth of tokens
(for every newcomer when no row is decoding; side by side in one pass where the model can), and one
decoding step for every row that is decoding, reading the weights once for all of them. Each row keeps
its own sampling settings, generator, KV cache and text decoder, so a reply is the same, token for
token, as the same reply generated alone.
"""

from __future__ import annotations

import time

from webapp.chat.decode.generate import Piece, Sequence, decode_step
from webapp.chat.decode.prefill import prefill_step
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.decode.publish import chat_result, publish
from webapp.chat.decode.types import ChatRequest
from webapp.chat.model.loading import LoadedChatModel
from webapp.core.executors import BatchedJobs, Finished, StepReport, Worker
from webapp.core.jobs import CANCELLED, DONE, FAILED, Job
from webapp.core.threads import torch_threads


class ChatBatch(BatchedJobs):
    """The batched executor: running replies are rows, stepped together."""

    def __init__(self, loaded: LoadedChatModel, max_rows: int, prefix: PrefixCache) -> None:
        self.loaded, self.max_rows = loaded, max_rows
        # Finished replies' caches, kept for their conversations' next turns under a budget (built at boot).
        self.prefix = prefix
        self._rows: dict[str, tuple[Job, Sequence]] = {}  # in order of admission

    @property
    def rows(self) -> int:
        return len(self._rows)

    def memory_bytes(self) -> int:
        return sum(seq.cache_bytes for _, seq in self._rows.values()) + self.prefix.nbytes

    def admit(self, job: Job) -> None:
        request: ChatRequest = job.request
        chat_result(job)
        self._rows[job.id] = (job, Sequence(self.loaded, request.prompt_ids, request.params, self.prefix,
                                            odds=request.odds, forced=request.forced,
                                            forced_odds=request.forced_odds, edit=request.edit))

    def step(self, core: Worker) -> StepReport:
        report, errors = StepReport(), dict[str, str]()
        rows = list(self._rows.values())
        for job, seq in rows:
            if job.cancelled:
                seq.cancel()
        clock = time.perf_counter()
        with torch_threads(self.loaded.torch_threads):
            decoding = any(seq.decoding for _, seq in rows)
            used, clock = self._prefill(newcomers_this_step([r for r in rows if r[1].prefilling], decoding),
                                        report, errors, core, clock)
            if used:
                # A reply that arrived during that pass need not wait a whole step: it is admitted now and,
                # while the step's prefill stays within one chunk's worth of tokens, prefilled before the
                # decoding pass, so its first token waits for one pass at most, not for a step.
                seen = {job.id for job, _ in rows}
                core.admit_waiting()
                clock = _spent(report, "admit", clock)
                rows = list(self._rows.values())
                late = [(job, seq) for job, seq in rows if job.id not in seen and seq.prefilling]
                _, clock = self._prefill(newcomers_this_step(late, True, used=used), report, errors, core, clock)
            decoding_rows = [(job, seq) for job, seq in rows if seq.decoding and job.id not in errors]
            if decoding_rows:
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

    def _prefill(self, newcomers: list[tuple[Job, Sequence]], report: StepReport, errors: dict[str, str],
                 core: Worker, clock: float) -> tuple[int, float]:
        """One prefill pass for these newcomers, their first tokens published at once -> (tokens, clock)."""
        if not newcomers:
            return 0, clock
        tokens = sum(len(seq.next_chunk) for _, seq in newcomers)
        report.prefill_tokens += tokens
        failed = prefill_step(self.loaded.model, [seq for _, seq in newcomers])
        errors.update({newcomers[i][0].id: _message(exc) for i, exc in failed.items()})
        clock = _spent(report, "prefill", clock)
        for job, seq in newcomers:  # their first tokens now, not after the decoding pass
            self._publish(job, seq.drain(), core)
        return tokens, _spent(report, "publish", clock)

    def _publish(self, job: Job, pieces: list[Piece], core: Worker) -> None:
        for piece in pieces:
            publish(job, piece, core)

    def _retire(self, job: Job, seq: Sequence, error: str | None, core: Worker) -> Finished:
        del self._rows[job.id]
        publish(job, seq.close(keep=error is None), core)
        if error is not None:
            return Finished(job, FAILED, error)
        return Finished(job, CANCELLED if seq.stop_reason == "cancelled" else DONE)


def newcomers_this_step(newcomers: list[tuple[Job, Sequence]], others_decoding: bool,
                        used: int = 0) -> list[tuple[Job, Sequence]]:
    """The newcomers that prefill a chunk in this step, each cut exactly as alone. While other rows are
    decoding: the oldest, and after it the next ones whose chunks still fit in one chunk's worth of tokens
    (its `chunk`), so a step never stalls the running rows for more than about one chunk of work, while a
    crowd of short prompts is still prefilled together instead of one a step. With no row decoding there
    is nobody to stall: every newcomer's next chunk runs, and a crowd arriving at an idle batch gets its
    first tokens together, after one pass, rather than each after the others' steps. `used`: tokens this
    step already prefilled (then even the oldest must fit)."""
    if not others_decoding:
        return newcomers
    if not newcomers:
        return []
    budget = newcomers[0][1].chunk
    chosen: list[tuple[Job, Sequence]] = []
    for job, seq in newcomers:
        tokens = len(seq.next_chunk)
        if (chosen or used) and used + tokens > budget:
            continue  # a shorter one behind it may still fit
        chosen.append((job, seq))
        used += tokens
    return chosen


def _spent(report: StepReport, phase: str, since: float) -> float:
    now = time.perf_counter()
    report.phases[phase] = report.phases.get(phase, 0.0) + now - since
    return now


def _message(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
