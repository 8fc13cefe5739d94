"""The Loop lab on the shared core: a request becomes a run job; a finished run's trace is saved."""

from __future__ import annotations

from webapp.core import InferenceCore
from webapp.core.jobs import DONE, Job
from webapp.loops.request import DemoRequest
from webapp.loops.runs import BATCHED, KINDS, MAIN, LoopResult
from webapp.loops.store import TraceStore


class LoopService:
    def __init__(self, core: InferenceCore, store: TraceStore) -> None:
        self.core = core
        self.store = store

    def start(self, owner: str, request: DemoRequest) -> Job[DemoRequest, LoopResult]:
        def save(job: Job[DemoRequest, LoopResult], outcome: str, error: str | None) -> None:
            if outcome == DONE and job.result.snapshot is not None:
                job.result.trace_id = self.store.save(owner, job.result.snapshot)

        job: Job[DemoRequest, LoopResult] = Job(self.kind(request), owner, request, on_finish=save,
                                                 result=LoopResult())
        return self.core.submit(job)

    def kind(self, request: DemoRequest) -> str:
        """Runs of a model that steps runs together join its batch (webapp/loops/batch.py); the others
        (an owner's model) run alone, one at a time."""
        from webapp.loops.batch import LoopBatch
        batch = self.core.executors.get(BATCHED)
        if isinstance(batch, LoopBatch) and batch.steps(getattr(request, "model", MAIN)):
            return BATCHED
        return "loops"

    def job(self, owner: str, job_id: str) -> Job[DemoRequest, LoopResult] | None:
        job = self.core.get(job_id)
        return job if job is not None and job.kind in KINDS and job.owner == owner else None
