"""The lab: its page, the editor, a run and its stream, Stop."""

from __future__ import annotations

import random

from flask import abort, redirect, render_template, request, url_for

from webapp.core import Refused
from webapp.loops.request import RequestError
from webapp.loops.trace import RowsEvent, metadata
from webapp.loops.web.blueprint import RUN_GONE, bp, model_choices, service, settings
from webapp.loops.web.forms import MAX_FORM_BYTES, EditorState, parse_request
from webapp.loops.web.render import editor_context, render_lab, render_results
from webapp.web import is_htmx, quotas, refusal_status
from webapp.web.bodies import body_limit
from webapp.web.security import owner_id
from webapp.web.sse import finished_stream, stream_job
from webapp.web.streams import held_slot


@bp.get("/")
def index():
    return render_lab(EditorState.default())


@bp.post("/editor")
@body_limit(MAX_FORM_BYTES)
def editor():
    state = EditorState.from_form(request.form)
    state.apply(request.form.get("action", ""), random.Random())
    if is_htmx():
        return render_template("loops/_editor.html", **editor_context(state))
    return render_lab(state)


@bp.post("/run")
@body_limit(MAX_FORM_BYTES)
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
    try:  # without JavaScript the request waits for the whole run, holding a stream slot
        with held_slot(not is_htmx()) as slot:
            quotas.check_traces(service().store, owner_id())
            job = service().start(owner_id(), demo_request)
    except Refused as error:
        abort(refusal_status(error), str(error))
    if slot is not None:  # without JavaScript: wait for the run, then show its permalink
        with slot:
            for _ in job.subscribe(settings().heartbeat_seconds):
                pass
        if job.result.trace_id is not None:
            return redirect(url_for("loops.trace", trace_id=job.result.trace_id), 303)
        state.errors = {"request": job.error or "The run was stopped."}
        return render_lab(state, status=500 if job.error else 200)
    return render_template("loops/_run_started.html", job=job, request=demo_request.payload(),
                           **editor_context(state))


@bp.get("/jobs/<job_id>/stream")
def stream(job_id: str):
    job = service().job(owner_id(), job_id)
    if job is None:
        # An ending stream, not a 404: the browser's EventSource would retry a 404 for ever.
        return finished_stream(render_template("loops/_gone.html", message=RUN_GONE))

    def render(event):
        if event.name == "rows" and isinstance(event.data, RowsEvent):
            return render_template("loops/_rows.html", rows=event.data.rows, steps=job.request.steps)
        if event.name in ("position", "running"):
            return render_template("loops/_run_status.html", event=event)
        return None

    return stream_job(job, render, final_results)


def final_results(job) -> str:
    snapshot = job.result.snapshot
    if snapshot is None:  # stopped or failed: show what arrived, and why it ended
        req = job.request
        rows = [row for e in job.events if isinstance(e.data, RowsEvent) for row in e.data.rows]
        snapshot = {**metadata(req, "", "live"), "status": "stopped", "trace": rows}
        return render_results(snapshot, job=job, error=job.error or "Stopped.")
    trace_id = job.result.trace_id
    return render_results(snapshot, job=job, trace_id=trace_id, recent=service().store.recent(job.owner),
                          address=url_for("loops.trace", trace_id=trace_id) if trace_id else None)


@bp.post("/jobs/<job_id>/stop")
def stop(job_id: str):
    job = service().job(owner_id(), job_id)
    if job is None:
        abort(404, "No such run.")
    job.cancel()
    return ("", 204) if is_htmx() else redirect(url_for("loops.index"), 303)
