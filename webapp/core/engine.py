"""The shared inference core: one worker owns the device and runs what the step scheduler plans.

Views never touch a model. A service submits a Job whose `request` is plain data. The scheduler
(webapp/core/scheduler.py) holds the waiting jobs and decides; the worker here runs a loop of turns,
executing each plan by calling the executors (webapp/core/executors.py, which do the device work):

1. admit the waiting jobs of a batched kind (chat on a KV-cached model) while their executor has room;
2. run at most one whole job (a Loop-lab run, or a chat reply on a model without a KV cache);
3. step every batched executor that has rows (each chat model's batch, in the order `to_step` says): its
   newcomers' prefill passes as `prefill_pass` plans them, then one decoding step for every running
   reply; and finish the rows that finished or were cancelled.

So a Loop-lab run never waits for a whole chat reply; and a whole job (a run, an Inside report) hands
the worker back every BATCH_SLICE_SECONDS (interleave, webapp/core/sharing.py, called between its units)
so running replies never stall for a whole job: the batches then step until they have had their share
of the time (scheduler.BulkShare, GLASSBOX_BULK_SHARE), and after a whole job ends, before the next one
starts. So a flood of whole jobs slows a reply by a bounded factor, never to a crawl. Waiting jobs keep
their order within their lane (the batch, or the whole jobs), and their position is their place in that
lane.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from webapp.core.executors import BatchedJobs, Executor, StepReport, WholeJobs
from webapp.core.jobs import CANCELLED, DONE, FAILED, AnyJob, Job, JobCancelled, JobState, RequestT, ResultT
from webapp.core.metrics import JobMetrics, StepMetrics
from webapp.core.refusals import CoreClosed, QueueFull, TooManyFromClient, TooManyJobs
from webapp.core.saves import Saves
from webapp.core.scheduler import BulkShare, Scheduler, prefill_pass
from webapp.core.sharing import WorkerSharing

log = logging.getLogger("glassbox.core")


class InferenceCore(WorkerSharing):
    def __init__(self, models: dict[str, Any], executors: dict[str, Executor] | None = None, *,
                 warmups: dict[str, Callable[[Any], None]] | None = None,
                 load_seconds: dict[str, float] | None = None, torch_threads: int = 0,
                 max_queue: int = 64, max_jobs_per_owner: int = 0, max_jobs_per_client: int = 0,
                 keep_finished: int = 512, bulk_share: float = 0.4) -> None:
        # Models are loaded by the caller (a broken checkpoint must stop start-up); from here
        # on only the worker thread touches them, through the executors.
        self.models = models
        self.executors = dict(executors or {})
        self.load_seconds = dict(load_seconds or {})
        self._warmups = warmups or {}
        self._torch_threads = torch_threads
        self.max_queue = max_queue
        self.max_jobs_per_owner = max_jobs_per_owner  # 0: no per-owner limit
        self.max_jobs_per_client = max_jobs_per_client  # 0: no per-address limit
        self.on_shutdown: list[Callable[[], None]] = []  # run once the worker has stopped (e.g. unlock the instance)
        self.warmup_error: str | None = None
        self.ready = threading.Event()  # set once every model has run one warm-up pass
        self.scheduler = Scheduler()  # the waiting jobs, and what runs next (under the lock)
        self._running: dict[str, AnyJob] = {}
        self._jobs: collections.OrderedDict[str, AnyJob] = collections.OrderedDict()
        self._keep_finished = keep_finished
        self.saves = Saves()  # finished jobs whose result could not be saved yet, tried again
        self._lock = threading.Condition()
        self._closed = False
        self.closing = threading.Event()  # set when shutdown begins: what a paced replay waits on, not a sleep
        # submitted, done, cancelled, failed, tokens, rows
        self.counters: collections.Counter[str] = collections.Counter()
        self.job_metrics = JobMetrics()  # per-kind outcomes, waits and run times; logs each job
        self.step_metrics = StepMetrics()  # rows per step, step time, prefill tokens, admitted, retired
        self.warmup_seconds: dict[str, float] = {}
        self.bulk = BulkShare(bulk_share)  # the worker's time whole jobs may take from running replies
        self._whole: AnyJob | None = None  # the whole job running now, on the worker
        self._whole_since = 0.0  # when it last took the worker back (see interleave)
        self._beside_depth = 0  # 1 while a whole job runs beside another, within its interleave
        self._worker_threads = 0
        self._worker = threading.Thread(target=self._work, name="glassbox-core", daemon=True)
        self._worker.start()

    # -- public API ------------------------------------------------------------------------
    def submit(self, job: Job[RequestT, ResultT]) -> Job[RequestT, ResultT]:
        if job.kind not in self.executors:
            raise ValueError(f"no executor for jobs of kind {job.kind!r}")
        with self._lock:
            if self._closed:
                raise CoreClosed()
            # Checked here, under the lock, so two requests of one browser cannot both slip in. A job of a
            # group already counted (a sweep's next run) adds nothing to what the limits count.
            if (self.max_jobs_per_owner and not self._group_counted(job, "owner")
                    and self._active_jobs(job.owner) >= self.max_jobs_per_owner):
                raise TooManyJobs()
            if (self.max_jobs_per_client and job.client and not self._group_counted(job, "client")
                    and self._active_jobs(job.client, by="client") >= self.max_jobs_per_client):
                raise TooManyFromClient()
            if len(self.scheduler) >= self.max_queue:
                raise QueueFull()
            self.scheduler.add(job)
            self._jobs[job.id] = job
            self.counters["submitted"] += 1
            job.seq = self.counters["submitted"]
            self._renumber()
            self._lock.notify_all()
        return job

    def get(self, job_id: str) -> AnyJob | None:
        with self._lock:
            return self._jobs.get(job_id)

    def find(self, kind: str, ref: Any) -> AnyJob | None:
        """The newest job of a kind with this reference (e.g. the chat message it writes)."""
        with self._lock:
            return next((j for j in reversed(self._jobs.values()) if j.kind == kind and j.ref == ref), None)

    def queue_length(self) -> int:
        with self._lock:
            return len(self.scheduler)

    def running_jobs(self) -> list[AnyJob]:
        with self._lock:
            return list(self._running.values())

    def count(self, name: str, n: int = 1, job: AnyJob | None = None) -> None:
        """Add to a production counter (tokens, loop rows), and to the job's own counts."""
        with self._lock:
            self.counters[name] += n
        if job is not None:
            job.counts[name] = job.counts.get(name, 0) + n

    def charge_bulk(self, seconds: float) -> None:
        """Bulk work done off the worker (a request thread's CPU on an Inside JSON, or on refusing one): owed
        back to running replies as the worker's whole jobs are (scheduler.BulkShare), from any thread."""
        self.bulk.ran_elsewhere(seconds)

    def _active_jobs(self, who: str, by: str = "owner") -> int:
        """Jobs of one owner (or client address) that are queued or running: what the limits count (the
        jobs of a group once)."""
        active = [j for j in self._jobs.values() if getattr(j, by) == who and not j.finished_state]
        return sum(j.group is None for j in active) + len({j.group for j in active if j.group is not None})

    def _group_counted(self, job: AnyJob, by: str) -> bool:
        """Whether a job of the same group, owner (or address) is already queued or running."""
        who = getattr(job, by)
        return job.group is not None and any(j.group == job.group and getattr(j, by) == who and not j.finished_state
                                             for j in self._jobs.values())

    @property
    def accepting(self) -> bool:
        return not self._closed

    def memory_bytes(self) -> int:
        return sum(ex.memory_bytes() for ex in self._batched().values())

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop taking jobs, cancel every queued and running one, and wait for the worker."""
        with self._lock:
            self._closed = True
            self.closing.set()
            pending = self.scheduler.waiting() + list(self._running.values())
            self._lock.notify_all()
        for job in pending:
            job.cancel()
        self._worker.join(timeout)
        for hook in self.on_shutdown:
            hook()
        self.on_shutdown.clear()

    # -- the worker ------------------------------------------------------------------------
    def _work(self) -> None:
        self._warm_up()
        spent = self.step_metrics.spent
        while True:
            self.saves.retry()
            waited = time.perf_counter()
            turn = self._next_turn()
            spent("waiting", time.perf_counter() - waited)
            if turn is None:
                return
            admitted, whole = turn
            started = time.perf_counter()
            for job in admitted:
                self._admit(job)
            spent("admit", time.perf_counter() - started)
            if whole is not None:
                self._run_whole(whole)
                self._pay_back()
            else:
                self._step_batches()

    def _warm_up(self) -> None:
        import torch
        if self._torch_threads:
            torch.set_num_threads(self._torch_threads)
        self._worker_threads = torch.get_num_threads()
        try:
            for name, warm_up in self._warmups.items():
                started = time.perf_counter()
                warm_up(self.models[name])
                self.warmup_seconds[name] = time.perf_counter() - started
                log.info("warmed up %s in %.2fs", name, self.warmup_seconds[name])
            self.ready.set()
        except Exception as error:  # stays unready, and says why on /readyz
            self.warmup_error = f"{type(error).__name__}: {error}"
            log.exception("model warm-up failed")

    def _next_turn(self) -> tuple[list[AnyJob], AnyJob | None] | None:
        """The jobs to admit to their batches, and the one whole job to run, as the scheduler takes them.
        Waits while there is nothing to do; None once closed and idle."""
        with self._lock:
            while True:
                admitted, whole = self._take(whole_too=True)
                busy = any(ex.rows for ex in self._batched().values())
                if admitted or whole or busy:
                    return admitted, whole
                if self._closed:
                    return None
                if self.saves.retry_due():
                    return [], None
                self._lock.wait(0.5)

    def _take(self, whole_too: bool) -> tuple[list[AnyJob], AnyJob | None]:
        """Under the lock: take the waiting jobs the batches have room for (and one whole job)."""
        for job in self.scheduler.drop_cancelled():
            self._finish_unstarted(job)
        room = {kind: ex.max_rows - ex.rows for kind, ex in self._batched().items()}
        admitted, whole = self.scheduler.take(room, whole_too)
        for job in admitted + ([whole] if whole else []):
            self._running[job.id] = job
        self._renumber()
        return admitted, whole

    def _admit_waiting(self) -> None:
        """Admit the waiting jobs of a batched kind that their executors have room for (the start of an
        interleaved step; and within a step, the replies that arrived during its prefill pass)."""
        with self._lock:
            admitted, _ = self._take(whole_too=False)
        for job in admitted:
            self._admit(job)

    def _renumber(self) -> None:
        """Under the lock: each waiting job's place in its lane, as the scheduler counts it."""
        for job, place in self.scheduler.positions(self._batched()):
            job.set_position(place)

    def _admit(self, job: AnyJob) -> None:
        job.set_state(JobState.RUNNING)
        try:
            executor = self.executors[job.kind]
            assert isinstance(executor, BatchedJobs)
            executor.admit(job)
            self.step_metrics.admitted += 1
        except Exception as exc:  # e.g. out of memory for its cache: this job fails, the batch goes on
            log.exception("admitting job %s (%s) failed", job.id, job.kind)
            self._finish(job, FAILED, str(exc) or type(exc).__name__)

    def _step(self, executor: BatchedJobs[Any, Any]) -> None:
        """One step of a batched executor, as the scheduler plans it: a prefill pass for the newcomers
        `prefill_pass` picks; if one ran, the replies that arrived during it are admitted and a second
        pass prefills those that still fit in the step's one chunk's worth of tokens, so a first token
        waits for the pass under way, not for a whole step; then the rest of the step (decoding)."""
        started = time.perf_counter()
        report = StepReport()
        try:
            executor.begin_step()
            first = prefill_pass(executor.newcomers(), executor.decoding())
            if first.rows:
                report.add(executor.prefill(first.rows, self))
                seen = {row.id for row in executor.newcomers()}
                admitting = time.perf_counter()
                self._admit_waiting()
                report.spent("admit", time.perf_counter() - admitting)
                late = [row for row in executor.newcomers() if row.id not in seen]
                second = prefill_pass(late, True, used=first.tokens)
                if second.rows:
                    report.add(executor.prefill(second.rows, self))
            report.add(executor.step(self))
        except Exception:  # an executor must report its rows' failures; never let the worker die
            log.exception("batched step failed")
        ended = time.perf_counter()
        self.step_metrics.observe(report, ended - started)
        for finished in report.finished:
            self._finish(finished.job, finished.outcome, finished.error)
        self.step_metrics.spent("finish", time.perf_counter() - ended)

    def _run_whole(self, job: AnyJob) -> None:
        job.set_state(JobState.RUNNING)
        self._whole, self._whole_since = job, time.perf_counter()
        outcome, error = DONE, None
        try:
            job.raise_if_cancelled()
            executor = self.executors[job.kind]
            assert isinstance(executor, WholeJobs)
            executor.run(job, self)
        except JobCancelled:
            outcome = CANCELLED
        except Exception as exc:  # reported to the user, never hidden
            outcome, error = FAILED, str(exc) or type(exc).__name__
            log.exception("job %s (%s) failed", job.id, job.kind)
        if outcome == DONE and job.cancelled:
            outcome = CANCELLED  # cancelled after the last check: still say so
        self._charge_whole()
        self._whole = None
        self._finish(job, outcome, error)

    def _finish(self, job: AnyJob, outcome: JobState, error: str | None) -> None:
        if job.save_error is not None:  # its partial result could not be saved: it stopped for that
            outcome, error = FAILED, job.save_error
        outcome, error = self.saves.call_on_finish(job, outcome, error)
        job.set_state(outcome, error)
        with self._lock:
            self._running.pop(job.id, None)
            self.counters[outcome] += 1
            self._retire(job)
        self.job_metrics.job_finished(job)

    def _finish_unstarted(self, job: AnyJob) -> None:
        outcome, error = self.saves.call_on_finish(job, CANCELLED, None)
        job.set_state(outcome, error)
        self.counters[outcome] += 1
        self._retire(job)
        self.job_metrics.job_finished(job)

    def _retire(self, job: AnyJob) -> None:
        # Finished jobs stay findable for replay; the oldest finished ones are forgotten.
        self._jobs.move_to_end(job.id)
        finished = [j for j in self._jobs.values() if j.finished_state and not self.saves.pending(j.id)]
        for old in finished[: max(0, len(finished) - self._keep_finished)]:
            del self._jobs[old.id]


__all__ = ["InferenceCore"]
