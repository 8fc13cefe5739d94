"""Checking an uploaded trace file before it is saved and replayed.

Targets are recomputed from the request, so a hand-edited file cannot show a wrong ✓.
"""

from __future__ import annotations

import json
import math

from webapp.loops.request import DemoRequest, RequestError
from webapp.loops.task import SYMBOLS
from webapp.loops.trace import SAFETY_CAP, STOP_THRESHOLD, TraceBuilder, score_trace

MAX_FILE_BYTES = 2 * 1024 * 1024


class TraceFileError(ValueError):
    pass


def parse_trace_file(data: bytes) -> dict:
    if not data:
        raise TraceFileError("Choose a trace file (.json) to upload.")
    if len(data) > MAX_FILE_BYTES:
        raise TraceFileError("That file is too large to be a Glassbox trace.")
    try:
        snapshot = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise TraceFileError("That file is not JSON; download a trace from Glassbox and upload that file.")
    if not isinstance(snapshot, dict) or snapshot.get("schema_version") != 1:
        raise TraceFileError("That file is not a Glassbox trace (schema_version 1).")
    try:
        request = DemoRequest.parse(snapshot.get("request"))
    except RequestError as error:
        raise TraceFileError(f"The trace's request is invalid: {error.message}")
    rows = snapshot.get("trace")
    if not isinstance(rows, list) or not 1 <= len(rows) <= SAFETY_CAP:
        raise TraceFileError(f"The trace must hold 1 to {SAFETY_CAP} loop rows.")
    for number, row in enumerate(rows, start=1):
        problem = _row_problem(row, number)
        if problem:
            raise TraceFileError(f"Loop row {number}: {problem}")
    reason = snapshot.get("summary", {}).get("stop_reason") if isinstance(snapshot.get("summary"), dict) else None
    if reason not in ("head", "cap"):
        raise TraceFileError("The trace's summary must say whether the head or the cap stopped it.")
    return {"request": request, "rows": rows, "stop_reason": reason,
            "checkpoint": str(snapshot.get("checkpoint", "unknown"))[:200]}


def _row_problem(row, number: int) -> str | None:
    if not isinstance(row, dict) or row.get("loop") != number:
        return "loops must be numbered 1, 2, 3, … in order"
    if row.get("prediction") not in list(SYMBOLS):
        return "the prediction must be an A–Z letter"
    if row.get("direct_prediction") not in [*SYMBOLS, None]:
        return "the direct prediction must be an A–Z letter or null"
    for key in ("stop_probability", "arrival_seconds"):
        value = row.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            return f"{key} must be a finite number ≥ 0"
    if row["stop_probability"] > 1:
        return "stop_probability must be at most 1"
    top3 = row.get("top3")
    if not isinstance(top3, list) or not all(isinstance(t, dict) and t.get("symbol") in list(SYMBOLS)
                                             and isinstance(t.get("probability"), (int, float)) for t in top3):
        return "top3 must list letters with probabilities"
    return None


def rescore(parsed: dict) -> dict:
    """A recorded snapshot with targets and summary recomputed from its own request."""
    request = parsed["request"]
    builder = TraceBuilder(request)
    keep = ("loop", "prediction", "direct_prediction", "stop_probability", "top3", "arrival_seconds")
    for row in parsed["rows"]:
        builder.add({k: row[k] for k in keep})
    rows = builder.rows
    return {"schema_version": 1, "source": "recorded", "checkpoint": parsed["checkpoint"],
            "request": request.payload(), "threshold": STOP_THRESHOLD, "safety_cap": SAFETY_CAP,
            "status": "complete", "trace": rows, "summary": score_trace(request, rows, parsed["stop_reason"]),
            "inference_seconds": rows[-1]["arrival_seconds"]}
