"""How whole jobs share the core's worker with the batches (InferenceCore's half that decides turns within a
whole job): a whole job hands the worker back every BATCH_SLICE_SECONDS (interleave, called between its
units of work); the reply batches then step until they have had the time owed to them (scheduler.BulkShare,
GLASSBOX_BULK_SHARE: _pay_back), the bulk batches (Loop-lab runs stepped together) step for up to
BULK_SLICE_SECONDS, and another client's waiting whole job of another kind may run in between, to its end
(_run_beside). Every second a whole job or a bulk step holds the worker is charged: to its client's
whole-job time (what orders the next whole jobs) and, while replies run, as steps owed to them.

The worker's own loop, admission and the executors' calls stay in webapp/core/engine.py; this mixin needs
from it the state declared below and four of its methods.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from webapp.core.executors import BatchedJobs, Executor
from webapp.core.jobs import AnyJob
from webapp.core.scheduler import BulkShare, Scheduler
from webapp.core.threads import torch_threads

# How long a whole job (a Loop-lab run, an Inside report) may hold the worker before running replies step
# again: a few decoding steps of a large model, a blink on screen.
BATCH_SLICE_SECONDS = 0.05
# How long the bulk batches (Loop-lab runs stepped together) may step within one of a whole job's pauses.
BULK_SLICE_SECONDS = 0.2


class WorkerSharing:
    """InferenceCore's turns within and after a whole job (see the module's docstring)."""

    executors: dict[str, Executor]
    scheduler: Scheduler
    bulk: BulkShare
    _lock: threading.Condition
    _running: dict[str, AnyJob]
    _whole: AnyJob | None  # the whole job running now, on the worker
    _whole_since: float  # when it last took the worker back
    _beside_depth: int  # 1 while a whole job runs beside another, within its interleave
    _worker_threads: int
    # the worker's own (webapp/core/engine.py)
    _admit_waiting: Callable[[], None]
    _step: Callable[[BatchedJobs[Any, Any]], None]
    _run_whole: Callable[[AnyJob], None]
    _renumber: Callable[[], None]

    def _batched(self) -> dict[str, BatchedJobs[Any, Any]]:
        return {kind: ex for kind, ex in self.executors.items() if isinstance(ex, BatchedJobs)}

    def _replies(self) -> dict[str, BatchedJobs[Any, Any]]:
        """The batches of replies (not bulk): what the bulk share pays back to."""
        return {kind: ex for kind, ex in self._batched().items() if not ex.bulk}

    def others_waiting(self, executor: object) -> bool:
        """Whether another executor's jobs are queued, or another batch has rows (Worker.others_waiting).
        Read without the lock: a guess that is a step late costs a step's length, no more."""
        if any(self.executors.get(job.kind) is not executor for job in self.scheduler.waiting()):
            return True
        return any(ex is not executor and ex.rows for ex in self._batched().values())

    def interleave(self) -> None:
        """Called by a whole job between its units of work (a Loop-lab run after each loop, Inside after
        each layer), on the worker: once it has held the worker for BATCH_SLICE_SECONDS, admit waiting
        replies and let the batches step for their share of the time (_pay_back), so running replies
        stall for a slice, not for a whole job; the bulk batches (Loop-lab runs stepped together) take one
        step; and another client's whole job that has had less of the worker runs here, in between
        (_run_beside), so a long job never holds up another address's short one for more than a unit.
        Steps run on the worker's own thread count, as they do outside a job, so a reply's numbers do not
        depend on where it stepped."""
        if time.perf_counter() - self._whole_since < BATCH_SLICE_SECONDS:
            return
        if self._batched():
            with torch_threads(self._worker_threads):
                self._pay_back()
                self._step_bulk()
        else:
            self._charge_whole()
        self._run_beside()

    def _step_bulk(self) -> None:
        """The bulk batches (Loop-lab runs stepped together) step until their rows end or BULK_SLICE_SECONDS
        pass, each step charged to the bulk share: a short run ends within one of the whole job's pauses."""
        bulk = {kind: ex for kind, ex in self._batched().items() if ex.bulk}
        until = time.perf_counter() + BULK_SLICE_SECONDS
        while bulk and time.perf_counter() < until:
            self._admit_waiting()
            stepping = self.scheduler.to_step({k: ex.rows for k, ex in bulk.items()})
            if not stepping:
                break
            for kind in stepping:
                started = time.perf_counter()
                self._step(bulk[kind])
                self._charge_bulk(time.perf_counter() - started)
        self._whole_since = time.perf_counter()  # their steps are not the whole job's time

    def _run_beside(self) -> None:
        """Within a running whole job, between its units: run another client's waiting whole job of another
        kind to its end, when that client has had less whole-job time (Scheduler.take_beside); one level
        deep (the job run beside it runs nothing beside itself). Another kind: an executor runs one job at a
        time. The running job is charged up to here and not for the time the other takes."""
        outer = self._whole
        if outer is None or self._beside_depth:
            return
        self._charge_whole()  # the running job's time so far, before the ranks are compared
        with self._lock:
            beside = self.scheduler.take_beside(outer, self._batched())
            if beside is None:
                return
            self._running[beside.id] = beside
            self._renumber()
        self._beside_depth += 1
        try:
            self._run_whole(beside)
        finally:
            self._beside_depth -= 1
            self._whole, self._whole_since = outer, time.perf_counter()

    def _charge_whole(self) -> None:
        """Count the running whole job's time since it last took the worker back: against its client (whose
        next whole job waits behind others' in proportion) and, while replies run, as steps owed to them."""
        now = time.perf_counter()
        seconds, self._whole_since = now - self._whole_since, now
        with self._lock:
            if self._whole is not None:
                self.scheduler.charge(self._whole, seconds)
        self._charge_bulk(seconds)

    def _charge_bulk(self, seconds: float) -> None:
        """Bulk work (a whole job, a step of a bulk batch) held the worker this long: while replies run,
        as steps owed to them."""
        replies = self._replies()
        busy = any(ex.rows for ex in replies.values())
        with self._lock:
            busy = busy or any(j.kind in replies for j in self.scheduler.waiting())
        self.bulk.ran_whole(seconds, busy)

    def _pay_back(self) -> None:
        """Between a whole job's slices, or after it ends: the reply batches step at least once, then on
        until they have had the time owed to them (BulkShare) or have no rows left."""
        self._charge_whole()
        self._repay()
        self._whole_since = time.perf_counter()  # the replies' steps are not the whole job's time

    def _repay(self) -> None:
        replies = self._replies()
        while True:
            self._admit_waiting()
            started = time.perf_counter()
            self._step_batches(replies_only=True)
            self.bulk.stepped(time.perf_counter() - started)
            if not any(ex.rows for ex in replies.values()):
                self.bulk.settle()
            if not self.bulk.due:
                break

    def _step_batches(self, replies_only: bool = False) -> None:
        """One step of each batched executor the scheduler says steps this turn (`replies_only`: of the
        reply batches, paying back bulk work). A bulk batch's step is charged to the bulk share, and the
        replies are paid back before anything else runs."""
        batched = self._replies() if replies_only else self._batched()
        for kind in self.scheduler.to_step({k: ex.rows for k, ex in batched.items()}):
            executor = batched[kind]
            started = time.perf_counter()
            self._step(executor)
            if executor.bulk:
                self._charge_bulk(time.perf_counter() - started)
                if self.bulk.due:
                    self._repay()
