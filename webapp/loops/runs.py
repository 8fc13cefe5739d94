"""Loop-lab runs on the core's worker: the executor, and a run's result as the service saves it."""

from __future__ import annotations

from typing import Any

from webapp.core.executors import WholeJobs, Worker
from webapp.core.jobs import Job
from webapp.core.threads import torch_threads
from webapp.loops.reading import supports_state
from webapp.loops.request import DemoRequest
from webapp.loops.trace import LoopResult, run_trace

__all__ = ["BATCHED", "KINDS", "MAIN", "LoopResult", "LoopRuns", "model_card"]

MAIN = "main"
BATCHED = "loops:batched"  # the core's kind for runs stepped together (webapp/loops/batch.py); "loops": alone
KINDS = ("loops", BATCHED)
# What the model picker calls each model; one not named here is shown by its name.
MODEL_LABELS = {MAIN: "Fully trained (bundled)", "early": "Early checkpoint (100 steps: makes mistakes)",
                "latent": "Latent state (carries its state)", "latent-early": "Latent state, early checkpoint"}


class LoopRuns(WholeJobs[DemoRequest, LoopResult]):
    """The core's executor for Loop-lab runs: a run is one model call, run whole between chat steps."""

    def __init__(self, bundle, torch_threads: int = 1, extra: dict | None = None) -> None:
        # The bundled model's loop is hundreds of tiny operators: one intra-op thread runs it faster than
        # two on a 2-core machine (docs/benchmarks-history.md, "Fast decoding (#5)", Loop lab).
        self.bundle, self.torch_threads = bundle, torch_threads
        self.bundles = {MAIN: bundle, **(extra or {})}  # what the page's model picker offers

    def run(self, job: Job[DemoRequest, LoopResult], core: Worker) -> None:
        bundle = self.bundles.get(getattr(job.request, "model", MAIN), self.bundle)
        if not isinstance(job.result, LoopResult):
            job.result = LoopResult()
        with torch_threads(self.torch_threads):
            job.result.snapshot = run_trace(job, bundle, job.request,
                                               on_rows=lambda rows: core.count("rows", len(rows), job),
                                               between=core.interleave)

    def choices(self) -> list[dict]:
        """The models offered, the main one first: each with its name, label, checkpoint and card (the
        same words as chat's: webapp/chat/registry.py's ModelCard)."""
        return [{"name": name, "label": MODEL_LABELS.get(name, name), "checkpoint": b.checkpoint_id,
                 "card": model_card(b.model), "carries_state": getattr(b.model, "carries_state", False) is True,
                 "gives_state": supports_state(b.model), "trained_k": getattr(b, "trained_k", None)}
                for name, b in self.bundles.items()]


def model_card(model: Any) -> dict:
    """What the page says of a looped model: its parameters and, where its config names them, its width,
    heads and window (an owner's model may name none of them)."""
    config = getattr(model, "config", None)
    return {"parameters": sum(p.numel() for p in model.parameters()), "width": getattr(config, "n_embd", None),
            "heads": getattr(config, "n_head", None), "window": getattr(config, "block_size", None)}
