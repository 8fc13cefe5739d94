"""The Loop lab's JSON API: POST /api/loops/trace streams a run as JSON lines."""

from __future__ import annotations

import dataclasses
import json

from flask import jsonify, request

from webapp.core import Refused
from webapp.loops.request import DemoRequest, RequestError
from webapp.loops.states import with_attention_measures
from webapp.loops.trace import RowsEvent, metadata
from webapp.loops.web.blueprint import api, model_choices, service, settings
from webapp.web import get_core, quotas, refusal_headers, refusal_status
from webapp.web.api_auth import CHALLENGE, key_owner, require_key
from webapp.web.security import csrf_exempt
from webapp.web.streams import held_slot, long_response

API_STREAMS = ("rows", "snapshots")
ATTENTION_FIELDS = ("read", "attention")  # in rows only with ?attention=1: up to ~1.3 kB a loop
STATE_FIELDS = ("state_change",)  # in rows only with ?state_change=1 (or ?analyses=state)
# ?analyses=state and ?analyses=attention (or both, "state,attention"): measures worked out once the run
# has ended (webapp/loops/states.py), so with them the rows come after the run
ANALYSES = {"state": ("state_change", "distance_to_last", "pca"),
            "attention": ("attention_entropy", "attention_shift")}


def _refuse(why: str, key_sent: bool):
    return jsonify({"error": why}), 401, CHALLENGE  # the Loop-lab API's own error shape


require_key(api, _refuse)  # with GLASSBOX_API_KEYS set, the same keys as /v1


def plain(row: dict, left_out: tuple[str, ...] = ATTENTION_FIELDS + STATE_FIELDS
          + ANALYSES["state"] + ANALYSES["attention"]) -> dict:
    """A row as the API gives it by default, without which rule it read, the weights and how much the
    state changed (each only when asked for)."""
    return {key: value for key, value in row.items() if key not in left_out}


def row_shape(args) -> tuple[tuple[str, ...], bool]:
    """-> (the fields the rows leave out, as ?attention=, ?state_change= and ?analyses= ask; whether
    the rows wait for the run's end, for the analyses); raises ValueError."""
    asked: set[str] = set()
    for name, fields in (("attention", ATTENTION_FIELDS), ("state_change", STATE_FIELDS)):
        if args.get(name, "0") not in ("0", "1"):
            raise ValueError(f"{name} must be 0 or 1")
        if args.get(name) == "1":
            asked.update(fields)
    analyses = [a for a in args.get("analyses", "").split(",") if a] if "analyses" in args else []
    if "analyses" in args and (not analyses or not set(analyses) <= set(ANALYSES)):
        raise ValueError("analyses must be state, attention or state,attention")
    for name in analyses:
        asked.update(ANALYSES[name])
    every = ATTENTION_FIELDS + STATE_FIELDS + ANALYSES["state"] + ANALYSES["attention"]
    return tuple(f for f in dict.fromkeys(every) if f not in asked), bool(analyses)


@api.get("/models")
def api_models():
    """The models the Loop lab offers, the main one first: [{"name", "checkpoint", "carries_state" (its
    state is what the next loop starts from), "gives_state" (it hands its state over, so the state's
    analyses work), "trained_k": [lo, hi] or null}]."""
    return jsonify([{key: m.get(key) for key in ("name", "label", "checkpoint", "carries_state", "gives_state",
                                                 "trained_k")} for m in model_choices()])


@api.post("/trace")
@csrf_exempt
def api_trace():
    """Takes the owner's request JSON; streams JSON lines. By default (?stream=rows) one line per loop
    with that loop's row, then one line with the summary and metadata (no rows: the client has them).
    ?stream=snapshots gives the owner's cumulative snapshots (streaming…, then complete), which grow
    with the square of the loops: ~12 MB for 256 steps, so only when asked for. ?attention=1 adds each
    row's "read" rule and "attention" weights (per head, over the prompt's characters), where the model
    hands them over; ?state_change=1 each row's "state_change", how much the loop block's state moved
    since the previous loop (null at loop 1; absent where the model does not give it). ?model=NAME runs
    it on another of the models offered (the main one by default). ?force_loops=N runs N loops whatever
    the head says and ?threshold=t stops at another stop probability. ?analyses=state adds each row's
    "distance_to_last" and "pca" too, ?analyses=attention its "attention_entropy" and "attention_shift":
    worked out once the run has ended, so with them every row comes after the run."""
    mode = request.args.get("stream", "rows")
    if mode not in API_STREAMS:
        return {"error": "stream must be rows or snapshots"}, 400
    try:
        left_out, after_run = row_shape(request.args)
    except ValueError as error:
        return {"error": str(error)}, 400

    def shape(row: dict) -> dict:
        return plain(row, left_out)
    try:
        value = request.get_json(silent=True)
    except RecursionError:  # silent=True catches ValueError only; nesting thousands deep is a client's error
        value = None
    if value is None:
        return {"error": "Send the request as JSON (Content-Type: application/json)"}, 400
    try:
        demo_request = DemoRequest.parse(value).with_options(request.args.get("force_loops"),
                                                             request.args.get("threshold"))
    except RequestError as error:
        return {"error": error.message}, 400
    # ?model=NAME: one of the models offered (a sweep's run on the early checkpoint, repeated alone)
    names = [m["name"] for m in model_choices()]
    model = request.args.get("model", names[0])
    if model not in names:
        return {"error": "model must be one of the models offered: " + ", ".join(names)}, 400
    demo_request = dataclasses.replace(demo_request, model=model)
    checkpoint = next((m["checkpoint"] for m in model_choices() if m["name"] == model), "")
    checkpoint = checkpoint or get_core().models["loops"].checkpoint_id
    # A key is its own owner (the per-owner limit counts per key). Without keys, a script without a
    # cookie gets a throwaway owner, not a session: its traces are purged after
    # GLASSBOX_API_RETENTION_HOURS (webapp/web/quotas.py), and no cookie is minted per request.
    owner = quotas.api_owner(service().store, key_owner())
    try:
        with held_slot() as slot:  # before the job: a refusal leaves nothing queued
            quotas.check_traces(service().store, owner)
            job = service().start(owner, demo_request)
    except Refused as error:
        return {"error": str(error)}, refusal_status(error), refusal_headers(error)

    def body():
        head, rows = None, []
        for event in job.subscribe(settings().heartbeat_seconds):
            if event is None:
                yield "\n"  # keep-alive; also how a vanished client is noticed
            elif isinstance(event.data, RowsEvent) and after_run:
                continue  # the analyses need every loop: the rows come with them, from the snapshot
            elif isinstance(event.data, RowsEvent) and mode == "rows":
                for row in event.data.rows:
                    yield json.dumps(shape(row)) + "\n"
            elif isinstance(event.data, RowsEvent):
                head = head or metadata(demo_request, checkpoint)
                for row in event.data.rows:  # one snapshot per loop, as the owner's API gives
                    rows.append(shape(row))
                    yield json.dumps({**head, "status": "streaming", "trace": rows}) + "\n"
        if job.result.snapshot is not None:
            final = {**job.result.snapshot, "trace_id": job.result.trace_id}
            trace = with_attention_measures(final["trace"]) if after_run else final["trace"]
            if mode == "rows" and after_run:
                for row in trace:
                    yield json.dumps(shape(row)) + "\n"
            if mode == "rows":
                final.pop("trace")
            else:
                final["trace"] = [shape(row) for row in trace]
            yield json.dumps(final) + "\n"
        else:
            status = "error" if job.error else "cancelled"
            yield json.dumps({"status": status, "error": job.error}) + "\n"

    return long_response(body(), "application/x-ndjson", slot)
