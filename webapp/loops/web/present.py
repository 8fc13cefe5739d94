"""Presenting the Loop lab (issue 31): "Present" makes a revocable follow link (webapp/present.py) to its
owner's Loop lab; followers see each run's rows as they come (the run's job, watched: computed once), the
trace the presenter opens and the player's position, which the presenter's page reports (static/present.js).

A run on another front end is not followed row by row (its job lives there); its followers see the trace
once the presenter's page shows it (the report names it, and the trace is read from the database).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from flask import abort, redirect, render_template, request, url_for

from webapp.core.jobs import Event
from webapp.digits import plain_digits
from webapp.loops.trace import RowsEvent
from webapp.loops.web.blueprint import bp, service, settings
from webapp.present import CHANGES, FOLLOW_POLL_SECONDS, SESSION, PresentLink
from webapp.web import follow, is_htmx
from webapp.web.security import owner_id
from webapp.web.sse import comment, frame

KIND = "loops"


@bp.post("/present")
def present():
    token = follow.links().make(owner_id(), KIND, "")
    return presented(token)


@bp.post("/unpresent")
def unpresent():
    follow.links().revoke(owner_id(), KIND, "")
    CHANGES.notify(f"loops:{owner_id()}")
    return presented(None)


def presented(token: str | None):
    if is_htmx():
        return render_template("loops/_present.html", present_token=token,
                               present_session=follow.links().of(owner_id(), SESSION, ""))
    return redirect(url_for("loops.index", _anchor="present"), 303)


@bp.post("/present/state")
def present_state():
    """What the presenter's page shows now (static/present.js): the trace and the player's loop."""
    trace = request.form.get("trace", "")[:64]
    loop = request.form.get("loop", "")
    if loop and not plain_digits(loop):
        abort(400, "loop must be a whole number.")
    if not follow.links().report(owner_id(), KIND, "", {"trace": trace, "loop": int(loop) if loop else None}):
        abort(404, "The Loop lab is not being presented.")
    CHANGES.notify(f"loops:{owner_id()}")
    return "", 204


def show_followers(state: dict) -> None:
    """The presenter's page shows something of its own (a sweep): its followers show it too, until the lab's
    page reports again (present_state). Nothing when the Loop lab is not presented."""
    follow.presented_here(KIND, "")  # a presenting session shows the lab from now on
    if follow.links().report(owner_id(), KIND, "", state):
        CHANGES.notify(f"loops:{owner_id()}")


def presenting() -> dict:
    """The lab's follow link while its owner presents it, and the presenting session's, which then shows
    the lab (webapp/web/follow.py)."""
    token, session = follow.presented_here(KIND, "")
    return {"present_token": token, "present_session": session}


# -- the followers --------------------------------------------------------------------------------
_RENDERED: dict[int, tuple[Event, str]] = {}  # a batch of rows' HTML, rendered once for every follower
_LOCK = threading.Lock()


def rows_html(event: Event, steps: int) -> str | None:
    if event.name != "rows" or not isinstance(event.data, RowsEvent):
        return None
    with _LOCK:
        kept = _RENDERED.get(id(event))
        if kept is not None and kept[0] is event:
            return kept[1]
    html = render_template("loops/_rows.html", rows=event.data.rows, steps=steps)
    with _LOCK:
        if len(_RENDERED) > 4096:
            _RENDERED.clear()
        _RENDERED[id(event)] = (event, html)
    return html


def saved_table(owner: str, trace_id: str) -> str | None:
    snapshot = service().store.get(owner, trace_id) if trace_id else None
    if snapshot is None:
        return None
    return render_template("follow/_loops_run.html", rows=snapshot.get("trace", []),
                           steps=snapshot["request"]["steps"], live=False, request=snapshot["request"])


def follow_page(link: PresentLink):
    table = saved_table(link.owner, link.state.get("trace", ""))
    return render_template("follow/loops.html", token=link.token, table=table, state=link.state)


def follow_events(link: PresentLink, moved: follow.Moved) -> Iterator[str]:
    """`run` (a run's table: live and empty, then finished; or a saved trace), `rows` (a live run's rows),
    `player` (the loop the presenter's player is at), until the link is revoked or `moved()`."""
    links, token, owner = follow.links(), link.token, link.owner
    key, heartbeat = f"loops:{owner}", settings().heartbeat_seconds
    seen, quiet_since = CHANGES.version(key), time.monotonic()
    job_shown, trace_shown, state_version = None, None, -1
    yield comment("open")
    while True:
        now = links.get(token)
        if now is None or moved():
            return
        job_id = service().latest.get(owner)
        job = service().job(owner, job_id) if job_id else None
        if job is not None and job.id != job_shown:
            job_shown = job.id
            steps = job.request.steps
            yield frame("run", render_template("follow/_loops_run.html", rows=[], steps=steps, live=True,
                                               request=job.request.payload()))
            rows: list = []
            checked = time.monotonic()
            for batch in job.subscribe_batches(FOLLOW_POLL_SECONDS, watch=True):
                if time.monotonic() - checked >= FOLLOW_POLL_SECONDS:
                    checked = time.monotonic()
                    if links.get(token) is None or moved():
                        return
                if batch is None:
                    yield comment("heartbeat")
                    continue
                frames = []
                for event in batch:
                    if (html := rows_html(event, steps)) is not None:
                        rows += event.data.rows  # type: ignore[attr-defined]
                        frames.append(frame("rows", html))
                if frames:
                    yield "".join(frames)
            trace_shown = job.result.trace_id
            yield frame("run", render_template("follow/_loops_run.html", rows=rows, steps=steps, live=False,
                                               request=job.request.payload()))
            continue
        if now.state_version != state_version:
            state_version = now.state_version
            trace = now.state.get("trace") or None
            if trace and trace != trace_shown:
                table = saved_table(owner, trace)
                if table is not None:
                    trace_shown = trace
                    yield frame("run", table)
            yield frame("player", render_template("follow/_loops_player.html", state=now.state, token=token))
        seen = CHANGES.wait(key, seen, FOLLOW_POLL_SECONDS)
        if time.monotonic() - quiet_since >= heartbeat:
            quiet_since = time.monotonic()
            yield comment("heartbeat")


FOLLOWER = follow.Follower(follow_page, follow_events)  # how the Loop lab's follow link is followed
