"""The Loop lab on the shared core: a request becomes a run job; a finished run's trace is saved."""

from __future__ import annotations

from webapp.core import InferenceCore
from webapp.core.jobs import DONE, Job
from webapp.loops.request import DemoRequest
from webapp.loops.runs import LoopResult
from webapp.loops.store import TraceStore
from webapp.present import CHANGES


class LoopService:
    def __init__(self, core: InferenceCore, store: TraceStore) -> None:
        self.core = core
        self.store = store
        self.latest: dict[str, str] = {}  # each owner's newest run started here: its job's id

    def start(self, owner: str, request: DemoRequest) -> Job[DemoRequest, LoopResult]:
        def save(job: Job[DemoRequest, LoopResult], outcome: str, error: str | None) -> None:
            if outcome == DONE and job.result.snapshot is not None:
                job.result.trace_id = self.store.save(owner, job.result.snapshot)

        job: Job[DemoRequest, LoopResult] = Job("loops", owner, request, on_finish=save, result=LoopResult())
        submitted = self.core.submit(job)
        self.latest[owner] = submitted.id  # what a follow link of this owner's Loop lab shows (webapp/present.py)
        CHANGES.notify(f"loops:{owner}")
        return submitted

    def job(self, owner: str, job_id: str) -> Job[DemoRequest, LoopResult] | None:
        job = self.core.get(job_id)
        return job if job is not None and job.kind == "loops" and job.owner == owner else None
