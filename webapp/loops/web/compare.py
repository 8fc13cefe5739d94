"""Two models on one table (issue 32, "Compare with …"): a finished trace's request run on another model,
and both traces side by side, the first loop where they differ marked, their players stepping together."""

from __future__ import annotations

import dataclasses

from flask import abort, redirect, render_template, request, url_for

from webapp.core import Refused
from webapp.loops.request import DEFAULT_THRESHOLD, DemoRequest, RequestError
from webapp.loops.verdict import of_trace
from webapp.loops.web import pictures
from webapp.loops.web.blueprint import bp, model_choices, model_name, owned_trace, service, settings
from webapp.loops.web.render import current_loop, state_context
from webapp.web import quotas, refusal_status
from webapp.web.security import owner_id
from webapp.web.streams import held_slot


def first_difference(a: list[dict], b: list[dict]) -> int | None:
    """The first loop at which the two traces differ: another letter, or one has stopped and the other
    runs on. None: the same letters, stopped at the same loop."""
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i]["prediction"] != b[i]["prediction"]:
            return i + 1
    return None


@bp.post("/traces/<trace_id>/compare")
def compare_start(trace_id: str):
    """Runs the trace's request on the model chosen (the request waits for it, as a run without
    JavaScript does: a few hundred loops), then shows both."""
    snapshot = owned_trace(trace_id)
    names = [m["name"] for m in model_choices()]
    model = request.form.get("model", "")
    if model not in names or model == model_name(snapshot.get("checkpoint", "")):
        abort(400, "Choose another of the models offered.")
    try:
        forced = snapshot.get("force_loops")
        demo_request = dataclasses.replace(DemoRequest.parse(snapshot["request"]).with_options(
            None if forced is None else str(forced), str(snapshot.get("threshold", DEFAULT_THRESHOLD))), model=model)
    except RequestError as error:
        abort(400, error.message)
    try:
        with held_slot() as slot:
            quotas.check_traces(service().store, owner_id())
            job = service().start(owner_id(), demo_request)
    except Refused as error:
        abort(refusal_status(error), str(error))
    assert slot is not None
    with slot:
        for _ in job.subscribe(settings().heartbeat_seconds):
            pass
    if job.result.trace_id is None:
        abort(500, job.error or "The run was stopped.")
    return redirect(url_for("loops.compare", first=trace_id, second=job.result.trace_id), 303)


@bp.get("/compare/<first>/<second>")
def compare(first: str, second: str):
    snapshots = [owned_trace(first), owned_trace(second)]
    if snapshots[0]["request"] != snapshots[1]["request"]:
        abort(404, "These two traces are not runs of the same request.")
    rows = [s.get("trace", []) for s in snapshots]
    differ = first_difference(*rows)
    current = current_loop(max(rows, key=len))
    labels = {m["checkpoint"]: m["label"] or m["name"] for m in model_choices()}
    columns = []
    for number, (trace_id, snapshot) in enumerate(zip((first, second), snapshots), start=1):
        req, summary = snapshot["request"], snapshot["summary"]
        at = min(current or len(snapshot["trace"]), len(snapshot["trace"]))
        chart = pictures.stop_chart(snapshot["trace"], req["steps"], snapshot["threshold"])
        verdict = of_trace(req, snapshot["trace"], summary["stop_reason"], summary.get("head_stop"))
        columns.append({"trace_id": trace_id, "snapshot": snapshot, "rows": snapshot["trace"], "summary": summary,
                        "verdict": verdict, "chart": chart, "settle": pictures.settle_chart(snapshot["trace"], chart),
                        "run_state": {**state_context(snapshot, snapshot["trace"], verdict, chart),
                                      "state_suffix": f"-{number}"},
                        "current_x": chart["x_of"](at), "at": at, "suffix": f"-{number}",
                        "label": labels.get(snapshot.get("checkpoint", ""), snapshot.get("checkpoint", "?"))})
    return render_template("loops/compare.html", columns=columns, differ=differ, current=current,
                           request=snapshots[0]["request"], steps=snapshots[0]["request"]["steps"],
                           player_url=url_for("loops.compare", first=first, second=second))

