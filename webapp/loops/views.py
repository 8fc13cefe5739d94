"""Loop-lab pages, streams, saved traces and the JSON API."""

from __future__ import annotations

import json
import random
import time

from flask import Blueprint, Response, abort, current_app, redirect, render_template, request, url_for

from webapp.core import Refused
from webapp.web import get_core, refusal_headers, refusal_status
from webapp.web.sse import comment, event_stream, finished_stream, frame, stream_job
from webapp.web.streams import long_response, take_slot
from webapp.web import storage
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


def model_choices() -> list[dict]:
    """The models the page offers (webapp/loops/service.py LoopRuns): the main one first."""
    runs = get_core().executors.get("loops")
    return runs.choices() if hasattr(runs, "choices") else [{"name": "main", "label": "", "checkpoint": ""}]


def model_name(checkpoint: str) -> str:
    """Which offered model recorded a trace (by its checkpoint id); the main one when none matches."""
    return next((m["name"] for m in model_choices() if m["checkpoint"] == checkpoint), "main")


def editor_context(state: EditorState) -> dict:
    return {"state": state, "symbols": SYMBOLS, "presets": PRESET_LABELS, "models": model_choices()}


def render_lab(state: EditorState, *, results: str = "", status: int = 200, upload_error: str | None = None):
    recent = service().store.recent(owner_id())
    return render_template("loops/page.html", results=results, recent=recent, upload_error=upload_error,
                           **editor_context(state)), status


def current_loop(rows: list) -> int | None:
    """?loop=N: the player's position, as a link gives it (no JavaScript needed); None: the whole run."""
    loop = request.args.get("loop", type=int)
    return None if loop is None or not rows else min(max(loop, 1), len(rows))


def render_results(snapshot: dict, *, job=None, trace_id: str | None = None, error: str | None = None,
                   recent: list | None = None, current: int | None = None, player_url: str | None = None,
                   shared: bool = False, share_token: str | None = None) -> str:
    """The results section; with `recent`, also an out-of-band refresh of the saved-traces list.

    A finished trace gets the player: step links to `player_url` (its own page) with ?loop=N, and
    with `current` the rows after loop N held back and loop N's letter ringed on the graph."""
    summary = snapshot.get("summary")
    rows = snapshot.get("trace", [])
    req = snapshot["request"]
    if player_url is None and trace_id:
        player_url = url_for("loops.trace", trace_id=trace_id)
    context = {"snapshot": snapshot, "rows": rows, "summary": summary, "job": job, "trace_id": trace_id,
               "error": error, "steps": req["steps"], "recent": recent, "current": current,
               "player_url": player_url, "shared": shared, "share_token": share_token,
               "model_label": next((m["label"] for m in model_choices()
                                    if m["checkpoint"] == snapshot.get("checkpoint") and m["label"]), None)}
    if summary is not None:
        context["graph"] = pictures.graph(req, rows, summary["first_error"])
        context["chart"] = pictures.stop_chart(rows, req["steps"], snapshot["threshold"])
        if rows:
            at = current or len(rows)
            context["current_symbol"] = rows[at - 1]["prediction"]
            context["current_x"] = context["chart"]["x_of"](at)
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
        return render_template("loops/_editor.html", **editor_context(state))
    return render_lab(state)


@bp.post("/run")
def run():
    state = EditorState.from_form(request.form)
    try:
        demo_request = parse_request(state, [m["name"] for m in model_choices()])
    except RequestError as error:
        state.errors = {error.field: error.message}
        if is_htmx():
            html = render_template("loops/_editor.html", **editor_context(state))
            return html, 400, {"HX-Retarget": "#editor", "HX-Reswap": "outerHTML"}
        return render_lab(state, status=400)
    # Without JavaScript the request waits for the whole run: it holds a stream slot, taken first
    # so that a refusal leaves no run behind.
    slot = None if is_htmx() else take_slot()
    try:
        storage.check_traces(owner_id())
        job = service().start(owner_id(), demo_request)
    except Refused as error:
        if slot:
            slot.release()
        abort(refusal_status(error), str(error))
    except BaseException:
        if slot:
            slot.release()
        raise
    if slot is not None:  # without JavaScript: wait for the run, then show its permalink
        with slot:
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
        results = render_results(snapshot, trace_id=trace_id, current=current_loop(snapshot.get("trace", [])),
                                 share_token=service().store.share_token(owner_id(), trace_id))
    state = EditorState.from_request(snapshot["request"], model_name(snapshot.get("checkpoint", "")))
    return render_lab(state, results=results)


# -- sharing on purpose: a read-only link anyone can open, until it is revoked --------------------
@bp.post("/traces/<trace_id>/share")
def share(trace_id: str):
    if service().store.share(owner_id(), trace_id) is None:
        abort(404, "No such trace.")
    return redirect(url_for("loops.trace", trace_id=trace_id, _anchor="share"), 303)


@bp.post("/traces/<trace_id>/unshare")
def unshare(trace_id: str):
    owned_trace(trace_id)
    service().store.unshare(owner_id(), trace_id)
    return redirect(url_for("loops.trace", trace_id=trace_id, _anchor="share"), 303)


@bp.get("/shared/<token>")
def shared(token: str):
    snapshot = service().store.shared(token)
    if snapshot is None:
        abort(404, "This shared trace does not exist or its owner stopped sharing it.")
    results = render_results(snapshot, current=current_loop(snapshot.get("trace", [])), shared=True,
                             player_url=url_for("loops.shared", token=token))
    return render_template("loops/shared.html", results=results, snapshot=snapshot)


@bp.get("/traces/<trace_id>.json")
def download(trace_id: str):
    snapshot = owned_trace(trace_id)
    return Response(json.dumps(snapshot, indent=1), mimetype="application/json",
                    headers={"Content-Disposition": f'attachment; filename="glassbox-trace-{trace_id}.json"'})


# A paced replay holds a stream slot and a thread for its whole length, and an uploaded trace may
# claim any pace (arrival_seconds of 1e300): recorded gaps are honoured up to REPLAY_MAX_GAP_SECONDS
# each, and whatever is still due after REPLAY_MAX_SECONDS arrives at once (templates/loops/_replay.html).
REPLAY_MAX_GAP_SECONDS = 1.0
REPLAY_MAX_SECONDS = 20.0


def replay_schedule(rows: list[dict]) -> list[float]:
    """When each row is due, in seconds from the replay's start: the recorded arrival times with each
    gap capped, and the whole capped."""
    due, at, previous = [], 0.0, 0.0
    for row in rows:
        arrival = float(row.get("arrival_seconds") or 0.0)
        at += min(max(arrival - previous, 0.0), REPLAY_MAX_GAP_SECONDS)
        previous = max(previous, arrival)
        due.append(min(at, REPLAY_MAX_SECONDS))
    return due


def replay_frames(rows: list[dict]) -> list[tuple[float, list[dict]]]:
    """(when, rows) per frame: rows due within FLUSH_SECONDS of a frame's first row share it, as live.
    Grouped by the recorded times, not by how long rendering took, so a busy host replays the same frames."""
    frames: list[tuple[float, list[dict]]] = []
    start = None
    for row, at in zip(rows, replay_schedule(rows)):
        if frames and at - start < FLUSH_SECONDS:
            frames[-1] = (at, frames[-1][1] + [row])
        else:
            start = at
            frames.append((at, [row]))
    return frames


@bp.get("/traces/<trace_id>/replay")
def replay_stream(trace_id: str):
    """A saved trace, re-streamed at its recorded pace (bounded): no model, no job, just the rows."""
    snapshot = {**owned_trace(trace_id), "source": "recorded"}

    def rows_frame(rows):
        return frame("rows", render_template("loops/_rows.html", rows=rows, steps=snapshot["request"]["steps"]))

    def body():
        yield comment("open")
        started = time.monotonic()
        for at, rows in replay_frames(snapshot["trace"]):
            delay = at - (time.monotonic() - started)
            if delay > 0:
                time.sleep(delay)
            yield rows_frame(rows)
        yield frame("done", render_results(snapshot, trace_id=trace_id))

    return event_stream(body())


@bp.post("/traces/upload")
def upload():
    file = request.files.get("trace")
    try:
        snapshot = parse_trace_file(file.read() if file else b"")
    except TraceFileError as error:  # said beside the upload field, on the lab's own page
        return render_lab(EditorState.default(), upload_error=str(error), status=400)
    rescored = rescore(snapshot)
    storage.check_traces(owner_id(), len(json.dumps(rescored)))
    trace_id = service().store.save(owner_id(), rescored)
    return redirect(url_for("loops.trace", trace_id=trace_id), 303)


# -- JSON API ---------------------------------------------------------------------------------
API_STREAMS = ("rows", "snapshots")


@api.post("/trace")
@csrf_exempt
def api_trace():
    """Takes the owner's request JSON; streams JSON lines. By default (?stream=rows) one line per loop
    with that loop's row, then one line with the summary and metadata (no rows: the client has them).
    ?stream=snapshots gives the owner's cumulative snapshots (streaming…, then complete), which grow
    with the square of the loops: ~12 MB for 256 steps, so only when asked for."""
    mode = request.args.get("stream", "rows")
    if mode not in API_STREAMS:
        return {"error": "stream must be rows or snapshots"}, 400
    try:
        value = request.get_json(silent=True)
    except RecursionError:  # silent=True catches ValueError only; nesting thousands deep is a client's error
        value = None
    if value is None:
        return {"error": "Send the request as JSON (Content-Type: application/json)"}, 400
    try:
        demo_request = DemoRequest.parse(value)
    except RequestError as error:
        return {"error": error.message}, 400
    # A script without a cookie gets a throwaway owner, not a session: its traces are purged after
    # GLASSBOX_API_RETENTION_HOURS (webapp/web/storage.py), and no cookie is minted per request.
    owner = storage.api_owner()
    slot = take_slot()  # before the job: a refusal leaves nothing queued
    try:
        storage.check_traces(owner)
        job = service().start(owner, demo_request)
    except Refused as error:
        slot.release()
        return {"error": str(error)}, refusal_status(error), refusal_headers(error)
    except BaseException:
        slot.release()
        raise

    def body():
        head, rows = None, []
        for event in job.subscribe(settings().heartbeat_seconds):
            if event is None:
                yield "\n"  # keep-alive; also how a vanished client is noticed
            elif event.name == "rows" and mode == "rows":
                for row in event.data["rows"]:
                    yield json.dumps(row) + "\n"
            elif event.name == "rows":
                head = head or metadata(demo_request, get_core().models["loops"].checkpoint_id)
                for row in event.data["rows"]:  # one snapshot per loop, as the owner's API gives
                    rows.append(row)
                    yield json.dumps({**head, "status": "streaming", "trace": rows}) + "\n"
        if "snapshot" in job.result:
            final = {**job.result["snapshot"], "trace_id": job.result.get("trace_id")}
            if mode == "rows":
                final.pop("trace")
            yield json.dumps(final) + "\n"
        else:
            status = "error" if job.error else "cancelled"
            yield json.dumps({"status": status, "error": job.error}) + "\n"

    return long_response(body(), "application/x-ndjson", slot)
