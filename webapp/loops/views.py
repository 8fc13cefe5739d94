"""Loop-lab pages, streams, saved traces and the JSON API."""

from __future__ import annotations

import json
import random
import time

from flask import (Blueprint, Response, abort, current_app, redirect, render_template, request,
                   stream_with_context, url_for)

from webapp.core import Refused
from webapp.web import get_core, refusal_headers, refusal_status
from webapp.web.sse import comment, finished_stream, frame, sse_response, stream_job
from webapp.loops import pictures
from webapp.loops.forms import PRESET_LABELS, EditorState, parse_request
from webapp.loops.recorded import TraceFileError, parse_trace_file, rescore
from webapp.loops.request import DemoRequest, RequestError
from webapp.loops.service import LoopService
from webapp.loops.store import TraceStore
from webapp.loops.trace import FLUSH_SECONDS, metadata
from webapp.loops.task import SYMBOLS
from webapp.security import csrf_exempt, owner_id

bp = Blueprint("loops", __name__, url_prefix="/loops")
api = Blueprint("loops_api", __name__, url_prefix="/api/loops")
RUN_GONE = "This run is no longer here (the server may have restarted). Finished runs are under Saved traces."


def service() -> LoopService:
    ext = current_app.extensions
    if "glassbox.loops" not in ext:
        ext["glassbox.loops"] = LoopService(get_core(), TraceStore(ext["glassbox.db"]))
    return ext["glassbox.loops"]


def settings():
    return current_app.config["GLASSBOX"]


def is_htmx() -> bool:
    return request.headers.get("HX-Request") == "true"


def render_lab(state: EditorState, *, results: str = "", status: int = 200):
    recent = service().store.recent(owner_id())
    return render_template("loops/page.html", state=state, symbols=SYMBOLS, presets=PRESET_LABELS,
                           results=results, recent=recent), status


def render_results(snapshot: dict, *, job=None, trace_id: str | None = None, error: str | None = None,
                   recent: list | None = None) -> str:
    """The results section; with `recent`, also an out-of-band refresh of the saved-traces list."""
    summary = snapshot.get("summary")
    rows = snapshot.get("trace", [])
    req = snapshot["request"]
    context = {"snapshot": snapshot, "rows": rows, "summary": summary, "job": job, "trace_id": trace_id,
               "error": error, "steps": req["steps"], "recent": recent}
    if summary is not None:
        context["graph"] = pictures.graph(req, rows, summary["first_error"])
        context["chart"] = pictures.stop_chart(rows, req["steps"], snapshot["threshold"])
    return render_template("loops/_results.html", **context)


# -- the page and its editor ------------------------------------------------------------------
@bp.get("/")
def index():
    return render_lab(EditorState.default())


@bp.post("/editor")
def editor():
    state = EditorState.from_form(request.form)
    state.apply(request.form.get("action", ""), random.Random())
    if is_htmx():
        return render_template("loops/_editor.html", state=state, symbols=SYMBOLS, presets=PRESET_LABELS)
    return render_lab(state)


@bp.post("/run")
def run():
    state = EditorState.from_form(request.form)
    try:
        demo_request = parse_request(state)
    except RequestError as error:
        state.errors = {error.field: error.message}
        if is_htmx():
            html = render_template("loops/_editor.html", state=state, symbols=SYMBOLS, presets=PRESET_LABELS)
            return html, 400, {"HX-Retarget": "#editor", "HX-Reswap": "outerHTML"}
        return render_lab(state, status=400)
    try:
        job = service().start(owner_id(), demo_request)
    except Refused as error:
        abort(refusal_status(error), str(error))
    if not is_htmx():  # without JavaScript: wait for the run, then show its permalink
        for _ in job.subscribe(settings().heartbeat_seconds):
            pass
        if "trace_id" in job.result:
            return redirect(url_for("loops.trace", trace_id=job.result["trace_id"]), 303)
        state.errors = {"request": job.error or "The run was stopped."}
        return render_lab(state, status=500 if job.error else 200)
    return render_template("loops/_live.html", job=job, request=demo_request.payload())


@bp.get("/jobs/<job_id>/stream")
def stream(job_id: str):
    job = service().job(owner_id(), job_id)
    if job is None:
        # An ending stream, not a 404: the browser's EventSource would retry a 404 for ever.
        return finished_stream(render_template("loops/_gone.html", message=RUN_GONE))

    def render(event):
        if event.name == "rows":
            return render_template("loops/_rows.html", rows=event.data["rows"], steps=job.request.steps)
        if event.name in ("position", "running"):
            return render_template("loops/_run_status.html", event=event)
        return None

    return stream_job(job, render, final_results)


def final_results(job) -> str:
    snapshot = job.result.get("snapshot")
    if snapshot is None:  # stopped or failed: show what arrived, and why it ended
        req = job.request
        rows = [row for e in job.events if e.name == "rows" for row in e.data["rows"]]
        snapshot = {**metadata(req, "", "live"), "status": "stopped", "trace": rows}
        return render_results(snapshot, job=job, error=job.error or "Stopped.")
    return render_results(snapshot, job=job, trace_id=job.result.get("trace_id"),
                          recent=service().store.recent(job.owner))


@bp.post("/jobs/<job_id>/stop")
def stop(job_id: str):
    job = service().job(owner_id(), job_id)
    if job is None:
        abort(404, "No such run.")
    job.cancel()
    return ("", 204) if is_htmx() else redirect(url_for("loops.index"), 303)


# -- saved traces -----------------------------------------------------------------------------
def owned_trace(trace_id: str) -> dict:
    snapshot = service().store.get(owner_id(), trace_id)
    if snapshot is None:
        abort(404, "No such trace.")
    return snapshot


@bp.get("/traces/<trace_id>")
def trace(trace_id: str):
    snapshot = owned_trace(trace_id)
    if request.args.get("replay") == "paced":
        results = render_template("loops/_replay.html", trace_id=trace_id, request=snapshot["request"])
    else:
        results = render_results(snapshot, trace_id=trace_id)
    return render_lab(EditorState.from_request(snapshot["request"]), results=results)


@bp.get("/traces/<trace_id>.json")
def download(trace_id: str):
    snapshot = owned_trace(trace_id)
    return Response(json.dumps(snapshot, indent=1), mimetype="application/json",
                    headers={"Content-Disposition": f'attachment; filename="glassbox-trace-{trace_id}.json"'})


@bp.get("/traces/<trace_id>/replay")
def replay_stream(trace_id: str):
    """A saved trace, re-streamed at its recorded pace: no model, no job, just the rows."""
    snapshot = {**owned_trace(trace_id), "source": "recorded"}

    def rows_frame(rows):
        return frame("rows", render_template("loops/_rows.html", rows=rows, steps=snapshot["request"]["steps"]))

    def body():
        yield comment("open")
        started, due = time.monotonic(), []
        for row in snapshot["trace"]:  # rows due within FLUSH_SECONDS of each other share a frame, as live
            delay = row["arrival_seconds"] - (time.monotonic() - started)
            if delay >= FLUSH_SECONDS:
                if due:
                    yield rows_frame(due)
                    due = []
                time.sleep(min(delay, 5.0))
            due.append(row)
        if due:
            yield rows_frame(due)
        yield frame("done", render_results(snapshot, trace_id=trace_id))

    return sse_response(body())


@bp.post("/traces/upload")
def upload():
    file = request.files.get("trace")
    try:
        snapshot = parse_trace_file(file.read() if file else b"")
    except TraceFileError as error:
        abort(400, str(error))
    trace_id = service().store.save(owner_id(), rescore(snapshot))
    return redirect(url_for("loops.trace", trace_id=trace_id), 303)


# -- JSON API ---------------------------------------------------------------------------------
@api.post("/trace")
@csrf_exempt
def api_trace():
    """Takes the owner's request JSON; streams snapshots as JSON lines (streaming…, then complete)."""
    value = request.get_json(silent=True)
    if not request.is_json or value is None:
        return {"error": "Send the request as JSON (Content-Type: application/json)"}, 400
    try:
        demo_request = DemoRequest.parse(value)
    except RequestError as error:
        return {"error": error.message}, 400
    try:
        job = service().start(owner_id(), demo_request)
    except Refused as error:
        return {"error": str(error)}, refusal_status(error), refusal_headers(error)

    def body():
        head, rows = None, []
        for event in job.subscribe(settings().heartbeat_seconds):
            if event is None:
                yield "\n"  # keep-alive; also how a vanished client is noticed
            elif event.name == "rows":
                head = head or metadata(demo_request, get_core().models["loops"].checkpoint_id)
                for row in event.data["rows"]:  # one snapshot per loop, as the owner's API gives
                    rows.append(row)
                    yield json.dumps({**head, "status": "streaming", "trace": rows}) + "\n"
        if "snapshot" in job.result:
            yield json.dumps({**job.result["snapshot"], "trace_id": job.result.get("trace_id")}) + "\n"
        else:
            status = "error" if job.error else "cancelled"
            yield json.dumps({"status": status, "error": job.error}) + "\n"

    return Response(stream_with_context(body()), mimetype="application/x-ndjson",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
