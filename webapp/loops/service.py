"""The Loop lab on the shared core: a request becomes a run job; a finished run's trace is saved."""

from __future__ import annotations

from collections.abc import Callable

from webapp.core import InferenceCore
from webapp.core.jobs import DONE, Job, JobState
from webapp.loops.request import DemoRequest
from webapp.loops.runs import BATCHED, KINDS, MAIN, LoopResult
from webapp.loops.store import TraceStore
from webapp.present import CHANGES

LoopJob = Job[DemoRequest, LoopResult]


class LoopService:
    def __init__(self, core: InferenceCore, store: TraceStore) -> None:
        self.core = core
        self.store = store
        self.latest: dict[str, str] = {}  # each owner's newest run started here: its job's id

    def start(self, owner: str, request: DemoRequest, *, save: bool = True,
              then: Callable[[LoopJob, str, str | None], None] | None = None, group: str | None = None) -> LoopJob:
        """save: keep the finished trace (a sweep's runs are not kept one by one: the sweep is);
        then: called with the job once it ended, whatever the outcome (a sweep counts it); group: the
        runs of one sweep, counted as one job against the core's limits."""
        def finish(job: Job[DemoRequest, LoopResult], outcome: JobState, error: str | None) -> None:
            try:
                if save and outcome == DONE and job.result.snapshot is not None:
                    job.result.trace_id = self.store.save(owner, job.result.snapshot)
            finally:
                if then is not None:
                    then(job, outcome, error)

        job: Job[DemoRequest, LoopResult] = Job(self.kind(request), owner, request, on_finish=finish,
                                                 result=LoopResult(), group=group)
        submitted = self.core.submit(job)
        if save:  # a run of the owner's own (not one of a sweep's): what a follow link shows (webapp/present.py)
            self.latest[owner] = submitted.id
            CHANGES.notify(f"loops:{owner}")
        return submitted

    def kind(self, request: DemoRequest) -> str:
        """Runs of a model that steps runs together join its batch (webapp/loops/batch.py); the others
        (an owner's model) run alone, one at a time."""
        return BATCHED if self.steps_together(getattr(request, "model", MAIN)) else "loops"

    def steps_together(self, model: str) -> bool:
        """Whether this model's runs (by its name in the picker) join the batch."""
        from webapp.loops.batch import LoopBatch
        batch = self.core.executors.get(BATCHED)
        return isinstance(batch, LoopBatch) and batch.steps(model)

    def job(self, owner: str, job_id: str) -> Job[DemoRequest, LoopResult] | None:
        job = self.core.get(job_id)
        return job if job is not None and job.kind in KINDS and job.owner == owner else None
