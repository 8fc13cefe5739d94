"""Follow links' own pages (issue 31): `/follow/<token>`, the follower's page, and `/follow/<token>/events`,
its SSE stream. No cookie is needed: the token is the permission. The web layer does not know the demos:
each says how its kind of link is followed (a Follower: webapp/chat/web/present.py, webapp/loops/web/present.py)
and create_app hands them to the app's state (`Glassbox.followers`).

A presenting session (issue 51; `POST /present`) is one link for everything its owner opens: each conversation
and the Loop lab the presenter opens gets its own link, which the session points at (webapp/present.py
PresentLinks.here), and the session's followers are shown that link's page. When the presenter opens another, their
stream says `moved` and static/follow.js loads the session's page again.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import segno
from flask import Blueprint, abort, current_app, g, redirect, render_template, request, url_for
from markupsafe import Markup

from webapp.present import CHANGES, FOLLOW_POLL_SECONDS, SESSION, PresentLink, PresentLinks, short_code
from webapp.web.prefs import back_to_page
from webapp.web.security import owner_id
from webapp.web.sse import comment, event_stream, frame
from webapp.web.state import glassbox

bp = Blueprint("follow", __name__, url_prefix="/follow")
short = Blueprint("follow_short", __name__)  # /f/<code>: a follow link typed from a projector; /present: a session

GONE = "This follow link does not exist, or its presenter stopped presenting."


Moved = Callable[[], bool]  # whether the session a link is followed through shows another link now


@dataclass(frozen=True)
class Follower:
    page: Callable[[PresentLink], object]  # the follower's page: the state now
    # SSE text: the state now, then the live rest, until the link is gone or moved() (the caller ends the stream)
    events: Callable[[PresentLink, Moved], Iterator[str]]


def links() -> PresentLinks:
    return PresentLinks(glassbox().db)


def follower_of(link: PresentLink) -> Follower:
    follower = glassbox().followers.get(link.kind)
    if follower is None:
        abort(404, GONE)
    return follower


def link_of(token: str) -> PresentLink:
    link = links().get(token)
    if link is None:
        abort(404, GONE)
    return link


@bp.get("/<token>")
def page(token: str):
    link = link_of(token)
    if link.kind != SESSION:
        return follower_of(link).page(link)
    shown = links().shown_by(link)
    if shown is None:
        return render_template("follow/waiting.html", token=token)
    g.follow_session = token  # the page's stream and "back to the presenter" are the session's
    return follower_of(shown).page(shown)


@bp.get("/<token>/events")
def events(token: str):
    link = link_of(token)
    if link.kind != SESSION:
        follower = follower_of(link)
        return event_stream(ended(follower.events(link, lambda: False)), follower=True)
    return event_stream(session_events(link, request.args.get("shown", ""),
                                       current_app.config["GLASSBOX"].heartbeat_seconds), follower=True)


def ended(stream: Iterator[str]) -> Iterator[str]:
    """A follow link's stream, then `done` (its link is gone: the presenter stopped presenting it)."""
    yield from stream
    yield frame("done", render_template("follow/_ended.html"))


class SessionReads:
    """A session's link, read once per FOLLOW_POLL_SECONDS for all its followers (each asks several times
    a second whether the presenter moved on)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[str, tuple[float, PresentLink | None]] = {}

    def read(self, token: str) -> PresentLink | None:
        with self._lock:
            kept = self._kept.get(token)
            if kept and time.monotonic() - kept[0] < FOLLOW_POLL_SECONDS:
                return kept[1]
        link = links().get(token)
        with self._lock:
            if len(self._kept) > 1000:
                self._kept.clear()
            self._kept[token] = (time.monotonic(), link)
        return link


SESSIONS = SessionReads()


def session_events(session: PresentLink, page_shows: str, heartbeat: float) -> Iterator[str]:
    """The stream of the link the session shows now, until the presenter opens another (`moved`: the page loads
    the session's page again) or stops presenting (`done`); while it shows nothing, heartbeats. `page_shows`:
    the link the follower's page was rendered with ("" for none), moved on already if it is not the one now."""
    shown = links().shown_by(session)
    where = session.state

    def moved() -> bool:  # a read kept from before this stream began is older, not a move
        now = SESSIONS.read(session.token)
        return now is None or (now.state_version > session.state_version and now.state != where)

    if (shown.token if shown else "") != page_shows:  # moved on already, since the page was rendered
        pass
    elif shown is not None:
        yield from follower_of(shown).events(shown, moved)
    else:
        yield from waiting(session.owner, moved, heartbeat)
    if links().get(session.token) is None:  # read afresh: a kept read may be from before Stop
        yield frame("done", render_template("follow/_ended.html"))
    else:  # moved on, or the link it showed was revoked: the session's page again says what it shows now
        yield frame("moved", url_for("follow.page", token=session.token))


def presented_here(kind: str, target: str) -> tuple[str | None, str | None]:
    """For the presenter's own page of (kind, target): (its follow link, the presenting session's link). While
    a session runs, it now shows this page, whose link is made if need be."""
    return links().here(owner_id(), kind, target)


def waiting(owner: str, moved: Moved, heartbeat: float) -> Iterator[str]:
    """Heartbeats until the session shows something (the presenter opened a page) or ends."""
    yield comment("open")
    key, quiet_since = f"{SESSION}:{owner}", time.monotonic()
    while not moved():
        CHANGES.wait(key, CHANGES.version(key), FOLLOW_POLL_SECONDS)
        if time.monotonic() - quiet_since >= heartbeat:
            quiet_since = time.monotonic()
            yield comment("heartbeat")


@short.post("/present")
def present_session():
    """Present everything this browser opens from now on: one follow link for the room (issue 51)."""
    links().make(owner_id(), SESSION, "")
    return back_to_page()  # the page pressed from, which the session then shows


@short.post("/present/stop")
def stop_session():
    """Stop presenting: every follow link of this browser is revoked, the session's and any "only this" link made
    beside it (their streams end): the room sees nothing more."""
    links().forget_owner(owner_id())
    return back_to_page()


@short.get("/f/<code>")
def by_code(code: str):
    """A follow link's short code (webapp/present.py short_code), as a person types it -> its follow page."""
    token = links().token_of_code(code[:16])
    if token is None:
        abort(404, GONE)
    return redirect(url_for("follow.page", token=token), 303)


@dataclass(frozen=True)
class FollowAddress:
    """A follow link as the room opens it: at the address people reach this app at (GLASSBOX_PUBLIC_URL, else
    the one this request came to, the proxy's Host where it is trusted), as a QR code, and as a short code."""

    url: str
    short_url: str
    qr: Markup  # an inline SVG, black on white in both themes (segno draws it: no script, no inline style)
    local: bool  # the address opens on this machine only (loopback): the room cannot open it


@bp.app_context_processor
def follow_context() -> dict:
    # following: the follow link a read-only view was opened through (a follower looking around on their own);
    # follow_session: the presenting session a follower's page is shown through
    return {"follow_address": follow_address, "following": g.get("follow_token"),
            "follow_session": g.get("follow_session"), "back_to_presenter": back_to_presenter}


def back_to_presenter(token: str) -> str:
    """Where "back to the presenter" goes from a view opened through follow link `token`: the presenting session
    whose own link it is (the room came through the session), else the link's own page."""
    return url_for("follow.page", token=links().made_by_session(token) or token)


def follow_address(token: str) -> FollowAddress:
    base = (current_app.config["GLASSBOX"].public_url.strip() or request.host_url).rstrip("/")
    url = base + url_for("follow.page", token=token)
    svg = segno.make(url, error="m").svg_inline(scale=4, dark="#000", light="#fff", svgclass="qr", omitsize=True)
    return FollowAddress(url, base + url_for("follow_short.by_code", code=short_code(token)), Markup(svg),
                         _loopback(urlsplit(base).hostname or ""))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
