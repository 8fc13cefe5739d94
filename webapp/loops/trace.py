"""Running the looped model natively and turning its per-loop observations into a trace.

The model is called once and reports after every loop; it never receives the reference
trajectory.  Targets (expected, correct, edge_valid) are added here, on the consumer side.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from webapp.core import Job
from webapp.loops.request import DemoRequest
from webapp.loops.task import SYMBOLS

SAFETY_CAP = 272
STOP_THRESHOLD = 0.5
SCHEMA_VERSION = 1


class ModelRefused(ValueError):
    pass


def check_model(model: Any) -> None:
    if model.training or getattr(model, "completion_head", None) is None:
        raise ModelRefused("Demo requires an eval-mode model with learned completion")


def metadata(request: DemoRequest, checkpoint_id: str, source: str = "live") -> dict:
    return {"schema_version": SCHEMA_VERSION, "source": source, "checkpoint": checkpoint_id,
            "request": request.payload(), "threshold": STOP_THRESHOLD, "safety_cap": SAFETY_CAP}


def observation(loop: int, scores, stop_logits, state_logits, seconds: float) -> dict:
    """What the model itself says at one loop (no targets yet)."""
    scores = scores[0].float().cpu()
    probability = float(torch.as_tensor(stop_logits).float().sigmoid().reshape(-1)[-1])
    if not bool(torch.isfinite(scores).all()) or not math.isfinite(probability):
        raise FloatingPointError("Nonfinite model output")
    probabilities = scores.softmax(-1)
    top = probabilities.topk(3)
    direct = None if state_logits is None else SYMBOLS[int(state_logits[0].argmax())]
    return {"loop": loop, "prediction": SYMBOLS[int(scores.argmax())], "direct_prediction": direct,
            "stop_probability": probability,
            "top3": [{"symbol": SYMBOLS[i], "probability": float(p)}
                     for p, i in zip(top.values.tolist(), top.indices.tolist())],
            "arrival_seconds": seconds}


class TraceBuilder:
    """Adds the consumer's targets to each observation, one hop of the reference per row."""

    def __init__(self, request: DemoRequest) -> None:
        self.request = request
        self.mapping = request.mapping
        self.reference = request.start
        self.previous_prediction = request.start
        self.rows: list[dict] = []

    def add(self, row: dict) -> dict:
        self.reference = self.mapping[self.reference]  # keeps advancing past k
        row = {**row, "expected": self.reference, "correct": row["prediction"] == self.reference,
               "edge_valid": self.mapping[self.previous_prediction] == row["prediction"]}
        self.previous_prediction = row["prediction"]
        self.rows.append(row)
        return row


def score_trace(request: DemoRequest, rows: list[dict], stop_reason: str) -> dict:
    """The final letter, the requested prefix and the stopping time are separate metrics."""
    expected = request.trajectory()
    predictions = [row["prediction"] for row in rows]
    answer_correct = bool(predictions) and predictions[-1] == expected[-1]
    exact_stop = stop_reason == "head" and len(rows) == request.steps
    return {"answer_correct": answer_correct,
            "complete_trajectory": len(rows) >= request.steps and predictions[:request.steps] == expected,
            "exact_stop": exact_stop,
            "joint_success": answer_correct and exact_stop,
            "stop_reason": stop_reason,
            "executed_loops": len(rows),
            "first_error": next((r["loop"] for r in rows[:request.steps] if not r["correct"]), None)}


def run_trace(job: Job, bundle: Any, request: DemoRequest, on_row=None) -> dict:
    """Run one request on the core's worker; emits a `row` event per loop, returns the snapshot."""
    model = bundle.model
    check_model(model)
    builder = TraceBuilder(request)
    started = time.perf_counter()

    def observe(loop, scores, stop_logits, state_logits):
        job.raise_if_cancelled()  # stops the model at the next loop
        row = builder.add(observation(loop, scores, stop_logits, state_logits, time.perf_counter() - started))
        if on_row is not None:
            on_row(row)
        job.emit("row", row=row)

    encoded = bundle.tokenizer(bundle.render_prompt(list(request.pairs), request.start, request.steps),
                               add_special_tokens=False, return_tensors="pt")
    device = next(model.parameters()).device
    with torch.inference_mode():
        result = model(input_ids=encoded["input_ids"].to(device),
                       attention_mask=encoded["attention_mask"].to(device),
                       num_loops=SAFETY_CAP, completion_threshold=STOP_THRESHOLD,
                       readout_token_ids=list(bundle.readout_token_ids), loop_callback=observe)
    final_stop = float(result.stop_logits[0, -1].float().sigmoid())
    reason = "head" if final_stop >= STOP_THRESHOLD else "cap"
    return {**metadata(request, bundle.checkpoint_id), "status": "complete", "trace": builder.rows,
            "summary": score_trace(request, builder.rows, reason),
            "inference_seconds": time.perf_counter() - started}
