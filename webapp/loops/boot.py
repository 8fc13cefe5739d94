"""The Loop lab at start-up, called by the app factory: load the model (and the others offered beside it),
give the core its executor, warm it up, and build the service the views call."""

from __future__ import annotations

import os

import torch

from webapp.config import ROOT, Settings
from webapp.core import InferenceCore
from webapp.db import AnyDatabase
from webapp.loops.batch import LoopBatch, batches
from webapp.loops.model.checkpoint import load_bundle
from webapp.loops.request import DemoRequest
from webapp.loops.runs import MAIN, LoopRuns
from webapp.loops.service import LoopService
from webapp.loops.store import TraceStore
from webapp.loops.sweeping import Sweeps
from webapp.loops.trace import check_model

# Offered beside the bundled model by default: its early checkpoint, and the latent-state model
# (webapp/loops/model/latent.py) fully trained and early.
BESIDE_BUNDLED = {"early": ROOT / "models" / "loops-early", "latent": ROOT / "models" / "loops-latent",
                  "latent-early": ROOT / "models" / "loops-latent-early"}
EARLY_BUNDLE = BESIDE_BUNDLED["early"]
SWEEP_WIDTH = 32  # a sweep's runs in flight at once: rows of one batch (webapp/loops/batch.py)


def load_model(settings: Settings):
    bundle = load_bundle(settings.loop_model)
    check_model(bundle.model)  # refuse at start-up, not on the first visitor's run
    return bundle


def extra_models(bundle) -> dict:
    """Models offered beside the main one: GLASSBOX_LOOP_EXTRA_MODELS=name=bundle-or-factory,… ; by
    default the bundled early checkpoint and the latent-state models (BESIDE_BUNDLED), beside the bundled
    model only."""
    spec = os.environ.get("GLASSBOX_LOOP_EXTRA_MODELS")
    if spec is None:
        bundled = str(getattr(bundle, "checkpoint_id", "")).startswith("bundled:loops@")
        spec = ",".join(f"{name}={path}" for name, path in BESIDE_BUNDLED.items() if bundled and path.is_dir())
    extra = {}
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        name, _, where = entry.partition("=")
        if not name.strip() or not where.strip() or name.strip() == MAIN:
            raise ValueError(f"GLASSBOX_LOOP_EXTRA_MODELS: {entry!r} is not name=bundle (and not {MAIN!r})")
        extra[name.strip()] = load_bundle(where.strip())
        check_model(extra[name.strip()].model)
    return extra


def executor(bundle, settings: Settings) -> LoopRuns:
    return LoopRuns(bundle, settings.loop_torch_threads, extra_models(bundle))


def batch_executor(runs: LoopRuns) -> LoopBatch | None:
    """The batch that steps the runs of the models that can (None: no model can, every run is alone)."""
    return LoopBatch(runs) if any(batches(b) for b in runs.bundles.values()) else None


def warm_up(bundle) -> None:
    request = DemoRequest.parse({"mapping": [[s, s] for s in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"],
                                 "start": "A", "steps": 2})
    encoded = bundle.tokenizer(bundle.render_prompt(list(request.pairs), "A", 2),
                               add_special_tokens=False, return_tensors="pt")
    with torch.inference_mode():
        bundle.model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"], num_loops=2,
                     completion_threshold=0.5, readout_token_ids=list(bundle.readout_token_ids),
                     loop_callback=lambda *args: None)


def service(core: InferenceCore, db: AnyDatabase) -> LoopService:
    return LoopService(core, TraceStore(db))


def sweeps(service: LoopService, settings: Settings) -> Sweeps:
    """A sweep's runs count as one job against the browser's and the address's limits (Job.group), so it
    keeps as many in flight as the batch steps well together, leaving half the core's queue to others (a
    run waits there only until the batch's next step takes it in)."""
    return Sweeps(service, in_flight=max(1, min(SWEEP_WIDTH, settings.max_queue // 2)))
