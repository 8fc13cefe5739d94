"""Sweeps on the web: POST /api/loops/sweep (JSON lines), the sweep form, a sweep's live and saved pages."""

from __future__ import annotations

import json

from flask import abort, g, jsonify, redirect, render_template, request, url_for

from webapp.core import Refused
from webapp.core.jobs import CLIENT, DONE
from webapp.loops.request import RequestError
from webapp.loops.store import is_sweep
from webapp.loops.sweep import SweepSpec
from webapp.loops.sweeping import SweepJob, Sweeps
from webapp.loops.web.blueprint import api, bp, model_choices, service, settings
from webapp.loops.web.forms import MAX_FORM_BYTES
from webapp.loops.web.present import KIND, show_followers
from webapp.loops.web.sweep_form import SweepForm
from webapp.loops.web.sweep_render import render_lab_with_sweep, render_sweep
from webapp.present import PresentLink
from webapp.web import follow, heavy, quotas, refusal_headers, refusal_status
from webapp.web.api_auth import key_owner
from webapp.web.bodies import body_limit
from webapp.web.security import csrf_exempt, owner_id
from webapp.web.sse import finished_stream, stream_job
from webapp.web.state import glassbox
from webapp.web.streams import held_slot, long_response

SWEEP_GONE = ("This sweep is no longer here (the server restarted, or another front end runs it). "
              "Finished sweeps are under Saved sweeps.")


def sweeps() -> Sweeps:
    return glassbox().service(Sweeps)


def parse_spec(value) -> SweepSpec:
    names = [m["name"] for m in model_choices()]
    return SweepSpec.parse(value, models=names, max_tables=settings().sweep_max_tables,
                           max_runs=settings().sweep_max_runs)


def start(owner: str, spec: SweepSpec) -> SweepJob:
    quotas.check_traces(service().store, owner)  # room for the sweep once saved
    return sweeps().start(owner, CLIENT.get(), spec)


@api.post("/sweep")
@csrf_exempt
def api_sweep():
    """Takes {"model", "family", "k", "tables", "seed", "runs"}; streams one JSON line per finished k (per
    model, with its "model"), then a summary line. Closing the connection stops the sweep."""
    try:
        value = request.get_json(silent=True)
    except RecursionError:
        value = None
    if value is None:
        return {"error": "Send the request as JSON (Content-Type: application/json)"}, 400
    try:
        spec = parse_spec(value)
    except RequestError as error:
        return {"error": error.message}, 400
    owner = quotas.api_owner(service().store, key_owner())
    try:
        with held_slot() as slot:
            job = start(owner, spec)
    except Refused as error:
        return jsonify({"error": str(error)}), refusal_status(error), refusal_headers(error)

    def body():
        for event in job.subscribe(settings().heartbeat_seconds):
            if event is None:
                yield "\n"  # keep-alive; also how a vanished client is noticed (and the sweep stopped)
            elif event.name == "line":
                data = event.data
                line = {**data["line"], "runs": data["runs"]} if spec.runs else data["line"]  # type: ignore[index]
                yield json.dumps(line) + "\n"
            elif event.name == "summary":
                yield json.dumps(event.data) + "\n"
        if job.state != DONE:
            yield json.dumps({"status": "error" if job.error else "cancelled", "error": job.error}) + "\n"

    return long_response(body(), "application/x-ndjson", slot)


# -- the page ----------------------------------------------------------------------------------
@bp.post("/sweeps")
@body_limit(MAX_FORM_BYTES)
def sweep_start():
    form = SweepForm.from_form(request.form)
    try:
        spec = parse_spec(form.as_value())
    except RequestError as error:
        form.errors = {error.field: error.message}
        return render_lab_with_sweep(form, status=400)
    try:
        job = start(owner_id(), spec)
    except Refused as error:
        abort(refusal_status(error), str(error))
    job.watched_elsewhere()  # a page's sweep runs to its end and is saved, watched or not
    return redirect(url_for("loops.sweep_live", job_id=job.id), 303)


def live_job(job_id: str) -> SweepJob | None:
    return sweeps().job(owner_id(), job_id)


@bp.get("/sweeps/live/<job_id>")
def sweep_live(job_id: str):
    job = live_job(job_id)
    if job is None:
        return render_template("loops/sweep_page.html", results=render_template(
            "loops/_gone.html", message=SWEEP_GONE)), 404
    if job.finished_state and job.result.sweep_id:
        return redirect(url_for("loops.sweep_saved", sweep_id=job.result.sweep_id), 303)
    show_followers({"view": "sweep", "sweep_live": job.id})
    return render_template("loops/sweep_page.html", results=render_sweep(live_snapshot(job), job=job),
                           live=not job.finished_state)


def live_snapshot(job: SweepJob, count: int | None = None) -> dict:
    """count: as it stood when that many lines had finished (a stream replayed late shows them one by one)."""
    lines = job.result.lines
    return {"spec": job.request.payload(), "lines": list(lines if count is None else lines[:count]),
            "summaries": job.result.summaries, "summary": job.result.summary if count is None else None,
            "paths": dict(job.result.paths)}


@bp.get("/sweeps/live/<job_id>/stream")
def sweep_stream(job_id: str):
    job = live_job(job_id)
    if job is None:
        return finished_stream(render_template("loops/_gone.html", message=SWEEP_GONE))
    return job_stream(job)


def job_stream(job: SweepJob, shared: bool = False):
    """A sweep's k lines as they finish, then its results whole; `shared`: a follower's, read-only (leaving
    neither keeps the sweep alive nor stops it)."""

    def render(event):
        if event.name == "line":
            return render_sweep(live_snapshot(job, event.data["count"]), job=job, fragment="progress", shared=shared)
        return None

    def final(job):
        saved = job.result.sweep_id
        snapshot = (service().store.get(job.owner, saved) if saved else None) or live_snapshot(job)
        return render_sweep(snapshot, job=job, sweep_id=saved, shared=shared,
                            error=None if saved else (job.error or "Stopped."))

    return stream_job(job, render, final, watch=shared, follower=shared)


@bp.post("/sweeps/live/<job_id>/stop")
def sweep_stop(job_id: str):
    job = live_job(job_id)
    if job is None:
        abort(404, "No such sweep.")
    job.cancel()
    return redirect(url_for("loops.sweep_live", job_id=job_id), 303)


def owned_sweep(sweep_id: str) -> dict:
    snapshot = service().store.get(owner_id(), sweep_id)
    if not is_sweep(snapshot):
        abort(404, "No such sweep.")
    return snapshot  # type: ignore[return-value]


@bp.get("/sweeps/<sweep_id>")
def sweep_saved(sweep_id: str):
    snapshot = owned_sweep(sweep_id)
    show_followers({"view": "sweep", "sweep": sweep_id})
    token = service().store.share_token(owner_id(), sweep_id)
    return render_template("loops/sweep_page.html", results=render_sweep(
        snapshot, sweep_id=sweep_id, share_token=token))


@bp.get("/sweeps/<sweep_id>.json")
def sweep_download(sweep_id: str):
    """The sweep's file, a heavy answer as a trace's is (webapp/loops/web/traces.py download)."""
    heavy.admit()
    if not service().store.owns(owner_id(), sweep_id):  # before the kept bytes: they are anyone's who names it
        abort(404, "No such sweep.")
    return heavy.kept_file(("sweep", sweep_id), f"glassbox-sweep-{sweep_id}.json", lambda: owned_sweep(sweep_id))


@bp.post("/sweeps/<sweep_id>/share")
def sweep_share(sweep_id: str):
    owned_sweep(sweep_id)
    service().store.share(owner_id(), sweep_id)
    return redirect(url_for("loops.sweep_saved", sweep_id=sweep_id, _anchor="share"), 303)


@bp.post("/sweeps/<sweep_id>/unshare")
def sweep_unshare(sweep_id: str):
    owned_sweep(sweep_id)
    service().store.unshare(owner_id(), sweep_id)
    return redirect(url_for("loops.sweep_saved", sweep_id=sweep_id, _anchor="share"), 303)


def shared_sweep(snapshot: dict):
    """/loops/shared/<token> of a sweep (webapp/loops/web/traces.py): read-only."""
    return render_template("loops/sweep_page.html", results=render_sweep(snapshot, shared=True))



# -- the presenter's sweep, on the followers' screens (issue 51) ---------------------------------------
@bp.get("/follow/<token>/sweep")
def followed_sweep(token: str):
    """The sweep the presenter of a Loop lab shows (running, or saved), read-only: never stopped from here."""
    link = followed_link(token)
    job = shown_job(link)
    if job is not None and not (job.finished_state and job.result.sweep_id):
        return render_template("loops/sweep_page.html", live=not job.finished_state, results=render_sweep(
            live_snapshot(job), job=job, shared=True, stream_url=url_for("loops.followed_sweep_stream", token=token)))
    sweep_id = job.result.sweep_id if job is not None else link.state.get("sweep")
    snapshot = service().store.get(link.owner, sweep_id) if sweep_id else None
    if not is_sweep(snapshot):
        abort(409, "The presenter is not showing a sweep now.")
    return render_template("loops/sweep_page.html", results=render_sweep(snapshot, shared=True))  # type: ignore[arg-type]


@bp.get("/follow/<token>/sweep/stream")
def followed_sweep_stream(token: str):
    job = shown_job(followed_link(token))
    if job is None:
        return finished_stream(render_template("loops/_gone.html", message=SWEEP_GONE))
    return job_stream(job, shared=True)


def followed_link(token: str) -> PresentLink:
    """A Loop lab's follow link (404 when revoked), its pages then read as a follower's (the way back)."""
    link = follow.links().get(token)
    if link is None or link.kind != KIND:
        abort(404, follow.GONE)
    g.follower, g.follow_token = True, token
    return link


def shown_job(link: PresentLink) -> SweepJob | None:
    job_id = link.state.get("sweep_live")
    return sweeps().job(link.owner, job_id) if isinstance(job_id, str) and job_id else None
