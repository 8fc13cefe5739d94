"""Saved traces: a trace's page and player, sharing, download, paced replay, upload."""

from __future__ import annotations

import json
import time

from flask import abort, redirect, render_template, request, url_for

from webapp.loops.recorded import TraceFileError, parse_trace_file, rescore
from webapp.loops.store import is_sweep
from webapp.loops.trace import FLUSH_SECONDS
from webapp.loops.web.blueprint import bp, model_name, owned_trace, service
from webapp.loops.web.forms import EditorState
from webapp.loops.web.render import current_loop, render_lab, render_results
from webapp.loops.web.sweep import shared_sweep
from webapp.web import get_core, heavy, quotas
from webapp.web.pages import INLINE_TOO_LARGE
from webapp.web.security import owner_id
from webapp.web.sse import comment, event_stream, frame


@bp.get("/traces/<trace_id>")
def trace(trace_id: str):
    snapshot = owned_trace(trace_id)
    if request.args.get("replay") == "paced":
        results = render_template("loops/_replay.html", trace_id=trace_id, request=snapshot["request"])
    else:
        results = render_results(snapshot, trace_id=trace_id, current=current_loop(snapshot.get("trace", [])),
                                 share_token=service().store.share_token(owner_id(), trace_id))
    state = EditorState.from_request(snapshot["request"], model_name(snapshot.get("checkpoint", "")), snapshot)
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
    if is_sweep(snapshot):
        return shared_sweep(snapshot)
    results = render_results(snapshot, current=current_loop(snapshot.get("trace", [])), shared=True,
                             player_url=url_for("loops.shared", token=token))
    return render_template("loops/shared.html", results=results, snapshot=snapshot)


@bp.get("/traces/<trace_id>.json")
def download(trace_id: str):
    """The trace's file: a heavy answer (webapp/web/heavy.py), made once and kept as bytes, counted against
    the address. A saved trace never changes, so its id is its file's key once the owner is checked."""
    heavy.admit()
    if not service().store.owns(owner_id(), trace_id):
        abort(404, "No such trace.")
    # Compact (Encoded.json): a row's attention weights, one a line, made a long run's file too large to upload
    return heavy.kept_file(("trace", trace_id), f"glassbox-trace-{trace_id}.json", lambda: owned_trace(trace_id))


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
    start = 0.0
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

    closing = get_core().closing

    def body():
        yield comment("open")
        started = time.monotonic()
        for at, rows in replay_frames(snapshot["trace"]):
            delay = at - (time.monotonic() - started)
            # On shutdown (SIGTERM) the pace is dropped: the rest comes at once with the `done` event,
            # so the stream ends well within gunicorn's graceful timeout and the browser does not reconnect.
            if delay > 0 and closing.wait(delay):
                break
            yield rows_frame(rows)
        yield frame("done", render_results(snapshot, trace_id=trace_id))

    return event_stream(body(), bulk=True)  # nobody waits on a replay as on a live reply: the bulk share


@bp.post("/traces/upload")
def upload():
    file = request.files.get("trace")
    try:
        snapshot = parse_trace_file(file.read() if file else b"")
    except TraceFileError as error:  # said beside the upload field, on the lab's own page
        return render_lab(EditorState.default(), upload_error=str(error), status=400)
    rescored = rescore(snapshot)
    quotas.check_traces(service().store, owner_id(), len(json.dumps(rescored)))
    trace_id = service().store.save(owner_id(), rescored)
    return redirect(url_for("loops.trace", trace_id=trace_id), 303)


def upload_too_large(limit_kib: int):
    """A file over the body limit: said beside the upload field, as every other bad file is."""
    return render_lab(EditorState.default(), status=413,
                      upload_error=f"That file is too large: the limit is {limit_kib:,} KiB.")


INLINE_TOO_LARGE["loops.upload"] = upload_too_large
