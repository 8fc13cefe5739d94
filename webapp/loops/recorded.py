"""Checking an uploaded trace file before it is saved and replayed.

Targets are recomputed from the request, so a hand-edited file cannot show a wrong ✓; so is the rule
each loop read, from the row's attention weights (a trace saved before they were recorded has none).
"""

from __future__ import annotations

import json
import math
from typing import TypeGuard

import torch

from webapp.loops.reading import read_rules, valid_attention
from webapp.loops.request import DemoRequest, RequestError
from webapp.loops.states import analyse
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
        snapshot = json.loads(data.decode("utf-8"), parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: nested thousands deep
        raise TraceFileError("That file is not JSON; download a trace from Glassbox and upload that file.")
    # type(...) is int: True == 1 in Python, and a float 1.0 is not the integer the schema names
    version = snapshot.get("schema_version") if isinstance(snapshot, dict) else None
    if type(version) is not int or version != 1:
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
    checkpoint = snapshot.get("checkpoint", "unknown")
    checkpoint = checkpoint if isinstance(checkpoint, str) else "unknown"
    # Only known fields are kept (rescore); the one free text is made valid UTF-8 (a lone surrogate
    # from a \ud800 escape cannot be written into a page) and bounded.
    return {"request": request, "rows": rows, "stop_reason": reason,
            "checkpoint": checkpoint.encode("utf-8", "replace").decode("utf-8")[:200]}


def _no_constants(name: str):
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python's json accepts them, browsers do not


def _row_problem(row, number: int) -> str | None:
    if not isinstance(row, dict) or row.get("loop") != number:
        return "loops must be numbered 1, 2, 3, … in order"
    if row.get("prediction") not in list(SYMBOLS):
        return "the prediction must be an A–Z letter"
    if row.get("direct_prediction") not in [*SYMBOLS, None]:
        return "the direct prediction must be an A–Z letter or null"
    for key in ("stop_probability", "arrival_seconds"):
        value = row.get(key)
        if not _finite(value) or value < 0:
            return f"{key} must be a finite number ≥ 0"
    if row["stop_probability"] > 1:
        return "stop_probability must be at most 1"
    top3 = row.get("top3")
    if not isinstance(top3, list) or len(top3) > 3 or not all(
            isinstance(t, dict) and t.get("symbol") in list(SYMBOLS) and _probability(t.get("probability"))
            for t in top3):
        return "top3 must list up to three letters with probabilities from 0 to 1"
    if "attention" in row and not valid_attention(row["attention"]):
        return "attention must hold, per head, one weight from 0 to 1 for each of the prompt's 88 characters"
    change = row.get("state_change")
    if change is not None and (not _finite(change) or change < 0):
        return "state_change must be null or a finite number ≥ 0"
    if "distance_to_last" in row and not (_finite(row["distance_to_last"]) and row["distance_to_last"] >= 0):
        return "distance_to_last must be a finite number ≥ 0"
    if "pca" in row and not (isinstance(row["pca"], list) and len(row["pca"]) == 2
                             and all(_finite(v) for v in row["pca"])):
        return "pca must be two finite numbers"
    return None


def _probability(value) -> bool:
    return _finite(value) and 0 <= value <= 1


def _finite(value: object) -> TypeGuard[int | float]:
    """A JSON number a float can hold: not a bool, not NaN or infinite, not an integer of 400 digits."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # math.isfinite converts an int to a float first
        return False


def rescore(parsed: dict) -> dict:
    """A recorded snapshot with targets and summary recomputed from its own request."""
    request = parsed["request"]
    builder = TraceBuilder(request)
    keep = ("loop", "prediction", "direct_prediction", "stop_probability", "top3", "arrival_seconds")
    for row in parsed["rows"]:
        kept = {k: row[k] for k in keep}
        kept["top3"] = [{"symbol": t["symbol"], "probability": t["probability"]} for t in row["top3"]]
        if "attention" in row:
            weights = [list(head) for head in row["attention"]]  # as written: a 0 stays "0", not "0.0"
            kept["read"] = read_rules(list(request.pairs), torch.tensor([weights], dtype=torch.float64))[0]
            kept["attention"] = weights
        for key in ("state_change", "distance_to_last", "pca"):  # the state's measures need its vectors: kept
            if key in row:
                kept[key] = row[key]
        builder.add(kept)
    rows = builder.rows
    analyses = analyse(rows, None)  # the attention's measures, again from the file's weights
    return {"schema_version": 1, "source": "recorded", "checkpoint": parsed["checkpoint"],
            "request": request.payload(), "threshold": STOP_THRESHOLD, "safety_cap": SAFETY_CAP,
            "status": "complete", "trace": rows, "summary": score_trace(request, rows, parsed["stop_reason"]),
            "analyses": analyses,
            "inference_seconds": rows[-1]["arrival_seconds"]}
