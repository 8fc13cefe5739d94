"""The Loop lab on the shared core: load the model, run a request as a job, save the trace."""

from __future__ import annotations

import torch

from webapp.core.engine import InferenceCore
from webapp.core.jobs import DONE, Job
from webapp.core.threads import torch_threads
from webapp.loops.request import DemoRequest
from webapp.loops.store import TraceStore
from webapp.loops.trace import check_model, run_trace


def load_model(settings):
    from webapp.loops.checkpoint import load_bundle
    bundle = load_bundle(settings.loop_model)
    check_model(bundle.model)  # refuse at start-up, not on the first visitor's run
    return bundle


class LoopRuns:
    """The core's executor for Loop-lab runs: a run is one model call, run whole between chat steps."""

    batched = False

    def __init__(self, bundle, torch_threads: int = 1) -> None:
        # The bundled model's loop is hundreds of tiny operators: one intra-op thread runs it
        # 1.9x faster than two on this 2-core machine (docs/benchmarks.md, Loop lab).
        self.bundle, self.torch_threads = bundle, torch_threads

    def run(self, job: Job, core) -> None:
        with torch_threads(self.torch_threads):
            job.result["snapshot"] = run_trace(job, self.bundle, job.request,
                                               on_rows=lambda rows: core.count("rows", len(rows), job))


def executor(bundle, settings) -> LoopRuns:
    return LoopRuns(bundle, settings.loop_torch_threads)


def warm_up(bundle) -> None:
    request = DemoRequest.parse({"mapping": [[s, s] for s in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"],
                                 "start": "A", "steps": 2})
    encoded = bundle.tokenizer(bundle.render_prompt(list(request.pairs), "A", 2),
                               add_special_tokens=False, return_tensors="pt")
    with torch.inference_mode():
        bundle.model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"], num_loops=2,
                     completion_threshold=0.5, readout_token_ids=list(bundle.readout_token_ids),
                     loop_callback=lambda *args: None)


class LoopService:
    def __init__(self, core: InferenceCore, store: TraceStore) -> None:
        self.core = core
        self.store = store

    def start(self, owner: str, request: DemoRequest) -> Job:
        def save(job: Job, outcome: str, error: str | None) -> None:
            if outcome == DONE:
                job.result["trace_id"] = self.store.save(owner, job.result["snapshot"])

        return self.core.submit(Job("loops", owner, request, on_finish=save))

    def job(self, owner: str, job_id: str) -> Job | None:
        job = self.core.get(job_id)
        return job if job is not None and job.kind == "loops" and job.owner == owner else None
