"""The shared inference core: one worker owns the device and runs jobs one at a time.

Views never touch a model.  They build a Job with a runner and submit it here; the worker
takes jobs from one FIFO queue, hands each runner the loaded models, and publishes
lifecycle changes.  Scheduling lives in `_take_next` alone, so a scheduler that steps
several jobs together (batched decoding) can replace it without touching the views.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable

from webapp.core.jobs import CANCELLED, DONE, FAILED, QUEUED, RUNNING, Job, JobCancelled
from webapp.core.metrics import JobMetrics

log = logging.getLogger("glassbox.core")


class CoreClosed(Exception):
    """The core is shutting down and takes no new jobs."""


class QueueFull(Exception):
    """Too many jobs are waiting already."""


class TooManyJobs(Exception):
    """This owner already has as many jobs queued or running as one browser may."""

    message = "You already have runs or replies waiting or running. Wait for one to finish or stop it."

    def __init__(self) -> None:
        super().__init__(self.message)


class InferenceCore:
    def __init__(self, models: dict[str, Any], *, warmups: dict[str, Callable[[Any], None]] | None = None,
                 load_seconds: dict[str, float] | None = None, torch_threads: int = 0,
                 max_queue: int = 64, max_jobs_per_owner: int = 0, keep_finished: int = 512) -> None:
        # Models are loaded by the caller (a broken checkpoint must stop start-up); from here
        # on only the worker thread touches them.
        self.models = models
        self.load_seconds = dict(load_seconds or {})
        self._warmups = warmups or {}
        self._torch_threads = torch_threads
        self.max_queue = max_queue
        self.max_jobs_per_owner = max_jobs_per_owner  # 0: no per-owner limit
        self.warmup_error: str | None = None
        self.ready = threading.Event()  # set once every model has run one warm-up pass
        self._queue: collections.deque[Job] = collections.deque()
        self._jobs: collections.OrderedDict[str, Job] = collections.OrderedDict()
        self._keep_finished = keep_finished
        self._lock = threading.Condition()
        self._closed = False
        self.running: Job | None = None
        self.counters = collections.Counter()  # submitted, done, cancelled, failed, tokens, rows
        self.job_metrics = JobMetrics()  # per-kind outcomes, waits and run times; logs each job
        self.warmup_seconds: dict[str, float] = {}
        self.open_streams = 0
        self._worker = threading.Thread(target=self._work, name="glassbox-core", daemon=True)
        self._worker.start()

    # -- public API ------------------------------------------------------------------------
    def submit(self, job: Job) -> Job:
        with self._lock:
            if self._closed:
                raise CoreClosed("The server is shutting down; try again in a moment")
            # Checked here, under the lock, so two requests of one browser cannot both slip in; the
            # chat view takes back the message it saved for a refused job.
            if self.max_jobs_per_owner and self._active_jobs(job.owner) >= self.max_jobs_per_owner:
                raise TooManyJobs()
            if len(self._queue) >= self.max_queue:
                raise QueueFull("The server is busy; try again in a moment")
            self._queue.append(job)
            self._jobs[job.id] = job
            self.counters["submitted"] += 1
            job.seq = self.counters["submitted"]
            self._renumber()
            self._lock.notify_all()
        return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def queue_length(self) -> int:
        with self._lock:
            return len(self._queue)

    def count(self, name: str, n: int = 1) -> None:
        """Add to a production counter (tokens, loop rows) from a runner."""
        with self._lock:
            self.counters[name] += n
            if self.running is not None:  # runners run on the worker, so this is their job
                self.running.counts[name] = self.running.counts.get(name, 0) + n

    def _active_jobs(self, owner: str) -> int:
        """Jobs of one owner that are queued or running (the per-browser limit counts these)."""
        return sum(1 for j in self._jobs.values() if j.owner == owner and j.state in (QUEUED, RUNNING))

    @property
    def accepting(self) -> bool:
        return not self._closed

    def stream_opened(self, delta: int) -> None:
        with self._lock:
            self.open_streams += delta

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop taking jobs, cancel every queued and running one, and wait for the worker."""
        with self._lock:
            self._closed = True
            pending = list(self._queue) + ([self.running] if self.running else [])
            self._lock.notify_all()
        for job in pending:
            job.cancel()
        self._worker.join(timeout)

    # -- the worker ------------------------------------------------------------------------
    def _work(self) -> None:
        self._warm_up()
        while True:
            job = self._take_next()
            if job is None:
                return
            self._run(job)

    def _warm_up(self) -> None:
        if self._torch_threads:
            import torch
            torch.set_num_threads(self._torch_threads)
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

    def _take_next(self) -> Job | None:
        with self._lock:
            while True:
                while self._queue and self._queue[0].cancelled:
                    self._finish_unstarted(self._queue.popleft())
                if self._queue:
                    job = self._queue.popleft()
                    self.running = job
                    self._renumber()
                    return job
                if self._closed:
                    return None
                self._lock.wait(0.5)
                for job in [j for j in self._queue if j.cancelled]:
                    self._queue.remove(job)
                    self._finish_unstarted(job)
                self._renumber()

    def _finish_unstarted(self, job: Job) -> None:
        self._call_on_finish(job, CANCELLED, None)
        job.set_state(CANCELLED)
        self.counters["cancelled"] += 1
        self._retire(job)
        self.job_metrics.job_finished(job)

    def _renumber(self) -> None:
        for place, waiting in enumerate(self._queue, start=1):
            waiting.set_position(place)

    def _run(self, job: Job) -> None:
        job.set_state(RUNNING)
        outcome, error = DONE, None
        try:
            job.raise_if_cancelled()
            job.runner(job, self)
        except JobCancelled:
            outcome = CANCELLED
        except Exception as exc:  # reported to the user, never hidden
            outcome, error = FAILED, str(exc) or type(exc).__name__
            log.exception("job %s (%s) failed", job.id, job.kind)
        if outcome == DONE and job.cancelled:
            outcome = CANCELLED  # cancelled after the last check: still say so
        self._call_on_finish(job, outcome, error)
        job.set_state(outcome, error)
        with self._lock:
            self.running = None
            self.counters[outcome] += 1
            self._retire(job)
        self.job_metrics.job_finished(job)

    def _call_on_finish(self, job: Job, outcome: str, error: str | None) -> None:
        # Save before announcing the end, so a reload right after "done" finds the saved result.
        if job.on_finish is None:
            return
        try:
            job.on_finish(job, outcome, error)
        except Exception:
            log.exception("on_finish of job %s failed", job.id)

    def _retire(self, job: Job) -> None:
        # Finished jobs stay findable for replay; the oldest finished ones are forgotten.
        self._jobs.move_to_end(job.id)
        finished = [j for j in self._jobs.values() if j.state not in (QUEUED, RUNNING)]
        for old in finished[: max(0, len(finished) - self._keep_finished)]:
            del self._jobs[old.id]
