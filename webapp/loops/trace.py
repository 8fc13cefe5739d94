"""Running the looped model natively and turning its per-loop observations into a trace.

The model is called once and reports after every loop; it never receives the reference
trajectory.  Targets (expected, correct, edge_valid) are added here, on the consumer side.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from webapp.core import JobCancelled
from webapp.core.jobs import AnyJob
from webapp.loops.reading import read_rules_of, rounded, supports_attention, supports_state, supports_state_change
from webapp.loops.request import DemoRequest
from webapp.loops.states import analyse
from webapp.loops.task import PROMPT_LENGTH, SYMBOLS

SAFETY_CAP = 272
STOP_THRESHOLD = 0.5
NEVER = 2.0  # a threshold no stop probability reaches: a forced run's loops all run
NONFINITE = "Nonfinite model output"
FLUSH_SECONDS = 1 / 60  # rows reach the streams in batches: about one per display frame
SCHEMA_VERSION = 1


class ModelRefused(ValueError):
    pass


@dataclass
class LoopResult:
    snapshot: dict | None = None  # the final snapshot, once the run completed
    trace_id: str | None = None  # where it was saved
    states: torch.Tensor | None = None  # [loops, C] each loop's state, kept when the request asks (a sweep's probe)


def check_model(model: Any) -> None:
    if model.training or getattr(model, "completion_head", None) is None:
        raise ModelRefused("Demo requires an eval-mode model with learned completion")


def metadata(request: DemoRequest, checkpoint_id: str, source: str = "live") -> dict:
    forced = {} if request.force_loops is None else {"force_loops": request.force_loops}
    return {"schema_version": SCHEMA_VERSION, "source": source, "checkpoint": checkpoint_id,
            "request": request.payload(), "threshold": request.threshold, "safety_cap": SAFETY_CAP, **forced}


def loops_to_run(request: DemoRequest) -> tuple[int, float]:
    """-> (num_loops, completion_threshold) for the model: a forced run's N loops with a threshold the
    head never reaches, else up to the safety cap at the request's threshold."""
    if request.force_loops is not None:
        return request.force_loops, NEVER
    return SAFETY_CAP, request.threshold


def observations(batch: list[tuple], pairs=None) -> tuple[list[dict], bool]:
    """What the model itself says at each loop of a batch (no targets yet).

    batch: (loop, scores [B, 26], stop_logits, state_logits or None, seconds, attention [B, nh, T]
    or None, state_change [B] or None) per loop; with attention (and the prompt's rules, `pairs`) a
    row also says which rule it read and keeps the weights.  The
    tensor work runs once per batch, not once per loop: a loop of the bundled model is so short that a
    dozen small operations and host reads per loop showed up whole (docs/benchmarks-history.md, "Fast decoding (#5)").
    -> (rows up to the first nonfinite loop, whether there was one)."""
    loops, loop_scores, loop_stops, states, seconds, attentions, changes = zip(*batch)
    n = len(batch)
    direct: list[int | None]
    if any(s is None for s in states):  # a model without a direct readout, on some loops or all
        direct = [None if s is None else int(s[0].argmax()) for s in states]
    else:
        direct = torch.stack(states)[:, 0].argmax(-1).tolist()
    attention = None
    if pairs is not None and all(a is not None for a in attentions):
        attention = torch.stack(attentions)[:, 0]
    change = None if any(c is None for c in changes) else torch.stack(changes).reshape(n, -1)[:, 0]
    rows, finite = loop_rows(list(loops), torch.stack(loop_scores)[:, 0], torch.stack(loop_stops).reshape(n, -1)[:, -1],
                             direct, list(seconds), attention, [pairs] * n, change)
    if all(finite):
        return rows, False
    return rows[:finite.index(False)], True


def loop_rows(loops: list[int], scores: torch.Tensor, stop_logits: torch.Tensor, direct: list[int | None],
              seconds: list[float], attention: torch.Tensor | None = None, pairs: Sequence | None = None,
              change: torch.Tensor | None = None) -> tuple[list[dict], list[bool]]:
    """Rows from n loops side by side (one run's loops, or one loop of many runs): scores [n, 26],
    stop_logits [n], attention [n, nh, T] with each row's rules `pairs` (or None), the state's change
    [n] (or None). -> (every row, whether each is finite). Each row's numbers come from its own
    values only, so a row is the same whatever else is in the batch."""
    n = len(loops)
    scores, stops = scores.float(), stop_logits.float().sigmoid()
    finite = (torch.isfinite(scores).all(-1) & torch.isfinite(stops)).tolist()
    probabilities = stops.tolist()
    top = scores.softmax(-1).topk(3)
    predictions = scores.argmax(-1).tolist()
    reads: Sequence[dict | None] = [None] * n
    weights: list[Any] = [None] * n
    if attention is not None and pairs is not None:
        attention = attention.float()
        reads, weights = read_rules_of(pairs, attention), rounded(attention)
    changes: list[float | None] = [None] * n
    if change is not None:
        changes = [c if math.isfinite(c) else None for c in change.double().tolist()]
    rows: list[dict[str, Any]] = []
    for i, (p3, i3) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
        extra = {} if reads[i] is None else {"read": reads[i], "attention": weights[i]}
        if change is not None:
            extra["state_change"] = changes[i]
        rows.append({"loop": loops[i], "prediction": SYMBOLS[predictions[i]],
                     "direct_prediction": _symbol(direct[i]),
                     "stop_probability": probabilities[i],
                     "top3": [{"symbol": SYMBOLS[k], "probability": p} for p, k in zip(p3, i3)],
                     "arrival_seconds": seconds[i], **extra})
    return rows, finite


@dataclass(frozen=True)
class RowsEvent:
    """A `rows` event's data: the trace rows of the loops that ran since the last one (TraceBuilder.add)."""

    rows: list[dict]


class Observer:
    """The model's loop_callback: keeps each loop's outputs and publishes them as rows in batches.

    One `rows` event per FLUSH_SECONDS (and for the first loop at once), instead of one per loop:
    every event wakes the stream threads, which then take the GIL from the worker."""

    def __init__(self, job: AnyJob, builder: TraceBuilder, on_rows=None, between=None, pairs=None) -> None:
        self.job, self.builder, self.on_rows, self.between = job, builder, on_rows, between
        self.pairs = pairs  # the prompt's rules in order, when the model hands over its attention
        self.started = self.flushed = time.perf_counter()
        self.pending: list[tuple] = []
        self.states: list[torch.Tensor] = []  # each loop's state, where the model hands it over

    def __call__(self, loop, scores, stop_logits, state_logits, attention=None, state_change=None,
                 state=None) -> None:
        self.job.raise_if_cancelled()  # stops the model at the next loop
        now = time.perf_counter()
        if state is not None:
            self.states.append(state[0].detach().clone())
        # Copies: they are read up to FLUSH_SECONDS later, and a model may reuse its output buffers.
        self.pending.append((loop, scores.clone(), torch.as_tensor(stop_logits).clone(),
                             None if state_logits is None else state_logits.clone(), now - self.started,
                             None if attention is None else attention.clone(),
                             None if state_change is None else torch.as_tensor(state_change).clone()))
        if loop == 1 or now - self.flushed >= FLUSH_SECONDS:
            self.flush()
        if self.between is not None:
            self.between()  # the core lets running chat replies step (InferenceCore.interleave)

    def flush(self, ended: bool = False) -> bool:
        """Publish the pending loops as one `rows` event; -> whether one was nonfinite.

        ended: the run stopped early (cancelled, or the model raised): keep the rows worked out
        before that, even once cancelled, and leave raising to the caller."""
        if not self.pending:
            return False
        batch, self.pending = self.pending, []
        self.flushed = time.perf_counter()
        rows, nonfinite = observations(batch, self.pairs)
        rows = [self.builder.add(row) for row in rows]
        if rows:
            if self.on_rows is not None:
                self.on_rows(rows)
            (self.job.keep if ended else self.job.emit)("rows", RowsEvent(rows))
        if nonfinite and not ended:
            raise FloatingPointError(NONFINITE)
        return nonfinite


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
    """The final letter, the requested prefix and the stopping time are separate metrics. A forced run
    (stop_reason "forced") is scored where its head would have stopped it (head_stop)."""
    expected = request.trajectory()
    predictions = [row["prediction"] for row in rows]
    head_stop = next((r["loop"] for r in rows if r.get("stop_probability", 0.0) >= request.threshold), None)
    if stop_reason == "forced":
        answer_correct = head_stop is not None and predictions[head_stop - 1] == expected[-1]
        exact_stop = head_stop == request.steps
    else:
        answer_correct = bool(predictions) and predictions[-1] == expected[-1]
        exact_stop = stop_reason == "head" and len(rows) == request.steps
    return {"head_stop": head_stop, "answer_correct": answer_correct,
            "complete_trajectory": len(rows) >= request.steps and predictions[:request.steps] == expected,
            "exact_stop": exact_stop,
            "joint_success": answer_correct and exact_stop,
            "stop_reason": stop_reason,
            "executed_loops": len(rows),
            "first_error": next((r["loop"] for r in rows[:request.steps] if not r["correct"]), None)}


def run_trace(job: AnyJob, bundle: Any, request: DemoRequest, on_rows=None, between=None) -> dict:
    """Run one request on the core's worker; emits `rows` events as loops run, returns the snapshot."""
    model = bundle.model
    check_model(model)
    num_loops, threshold = loops_to_run(request)
    builder = TraceBuilder(request)
    prompt = bundle.render_prompt(list(request.pairs), request.start, request.steps)
    encoded = bundle.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
    # Which rule each loop read needs one weight per character of the v1 prompt.
    attention = supports_attention(model) and encoded["input_ids"].shape[-1] == len(prompt) == PROMPT_LENGTH
    observe = Observer(job, builder, on_rows, between, pairs=list(request.pairs) if attention else None)
    started = observe.started

    device = next(model.parameters()).device
    try:
        with torch.inference_mode():
            result = model(input_ids=encoded["input_ids"].to(device),
                           attention_mask=encoded["attention_mask"].to(device),
                           num_loops=num_loops, completion_threshold=threshold,
                           readout_token_ids=list(bundle.readout_token_ids), loop_callback=observe,
                           **({"loop_attention": True} if attention else {}),
                           **({"loop_state_change": True} if supports_state_change(model) else {}),
                           **({"loop_state": True} if supports_state(model) else {}))
    except Exception as error:  # cancelled (JobCancelled) or the model failed: keep the rows so far
        try:
            nonfinite = observe.flush(ended=True)
        except Exception:
            raise error from None
        if nonfinite and not isinstance(error, (JobCancelled, FloatingPointError)):
            raise FloatingPointError(NONFINITE) from error  # e.g. the model's own assert on a NaN
        raise
    observe.flush()
    final_stop = float(result.stop_logits[0, -1].float().sigmoid())
    return complete(request, bundle.checkpoint_id, builder.rows, final_stop, started, observe.states, job)


def complete(request: DemoRequest, checkpoint_id: str, rows: list[dict], final_stop: float, started: float,
             states: list[torch.Tensor] | None = None, job: AnyJob | None = None) -> dict:
    """A finished run's snapshot: its rows, scored, with what its state did (webapp/loops/states.py);
    `final_stop`: the last loop's stop probability; `states`: each loop's state, where the model gave it,
    kept beside the snapshot in the `job`'s result (never in it) when the request asks (a sweep's probe,
    webapp/loops/probe.py)."""
    if request.force_loops is not None:
        reason = "forced"
    else:
        reason = "head" if final_stop >= request.threshold else "cap"
    kept = torch.stack(states[:len(rows)]) if states and len(states) >= len(rows) > 0 else None
    if kept is not None and request.keep_states and job is not None and isinstance(job.result, LoopResult):
        job.result.states = kept.float().cpu()
    analyses = analyse(rows, kept)
    return {**metadata(request, checkpoint_id), "status": "complete", "trace": rows,
            "summary": score_trace(request, rows, reason), "analyses": analyses,
            "inference_seconds": time.perf_counter() - started}


def _symbol(index: int | None) -> str | None:
    return None if index is None else SYMBOLS[index]
