"""The Loop lab on the shared core: load the model, run a request as a job, save the trace."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from webapp.core.engine import InferenceCore
from webapp.core.jobs import DONE, Job
from webapp.core.threads import torch_threads
from webapp.loops.request import DemoRequest
from webapp.loops.store import TraceStore
from webapp.loops.trace import check_model, run_trace


EARLY_BUNDLE = Path(__file__).resolve().parents[2] / "models" / "loops-early"
MAIN = "main"
# What the model picker calls each model; one not named here is shown by its name.
MODEL_LABELS = {MAIN: "Fully trained (bundled)", "early": "Early checkpoint (100 steps: makes mistakes)"}


def load_model(settings):
    from webapp.loops.checkpoint import load_bundle
    bundle = load_bundle(settings.loop_model)
    check_model(bundle.model)  # refuse at start-up, not on the first visitor's run
    return bundle


class LoopRuns:
    """The core's executor for Loop-lab runs: a run is one model call, run whole between chat steps."""

    batched = False

    def __init__(self, bundle, torch_threads: int = 1, extra: dict | None = None) -> None:
        # The bundled model's loop is hundreds of tiny operators: one intra-op thread runs it
        # 1.9x faster than two on this 2-core machine (docs/benchmarks.md, Loop lab).
        self.bundle, self.torch_threads = bundle, torch_threads
        self.bundles = {MAIN: bundle, **(extra or {})}  # what the page's model picker offers

    def run(self, job: Job, core) -> None:
        bundle = self.bundles.get(getattr(job.request, "model", MAIN), self.bundle)
        with torch_threads(self.torch_threads):
            job.result["snapshot"] = run_trace(job, bundle, job.request,
                                               on_rows=lambda rows: core.count("rows", len(rows), job),
                                               between=core.interleave)

    def choices(self) -> list[dict]:
        return [{"name": name, "label": MODEL_LABELS.get(name, name), "checkpoint": b.checkpoint_id}
                for name, b in self.bundles.items()]


def extra_models(bundle) -> dict:
    """Models offered beside the main one: GLASSBOX_LOOP_EXTRA_MODELS=name=bundle-or-factory,… ; by
    default the bundled early checkpoint (models/loops-early), beside the bundled model only."""
    from webapp.loops.checkpoint import load_bundle
    spec = os.environ.get("GLASSBOX_LOOP_EXTRA_MODELS")
    if spec is None:
        bundled = str(getattr(bundle, "checkpoint_id", "")).startswith("bundled:loops@")
        spec = f"early={EARLY_BUNDLE}" if bundled and EARLY_BUNDLE.is_dir() else ""
    extra = {}
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        name, _, where = entry.partition("=")
        if not name.strip() or not where.strip() or name.strip() == MAIN:
            raise ValueError(f"GLASSBOX_LOOP_EXTRA_MODELS: {entry!r} is not name=bundle (and not {MAIN!r})")
        extra[name.strip()] = load_bundle(where.strip())
        check_model(extra[name.strip()].model)
    return extra


def executor(bundle, settings) -> LoopRuns:
    return LoopRuns(bundle, settings.loop_torch_threads, extra_models(bundle))


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
