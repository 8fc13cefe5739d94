"""Follow links' own pages (issue 31): `/follow/<token>`, the follower's page, and `/follow/<token>/events`,
its SSE stream. No cookie is needed: the token is the permission. The web layer does not know the demos:
each says how its kind of link is followed (a Follower: webapp/chat/web/present.py, webapp/loops/web/present.py)
and create_app hands them to the app's state (`Glassbox.followers`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import segno
from flask import Blueprint, abort, current_app, g, redirect, request, url_for
from markupsafe import Markup

from webapp.present import PresentLink, PresentLinks, short_code
from webapp.web.sse import event_stream
from webapp.web.state import glassbox

bp = Blueprint("follow", __name__, url_prefix="/follow")
short = Blueprint("follow_short", __name__)  # /f/<code>: a follow link typed from a projector

GONE = "This follow link does not exist, or its presenter stopped presenting."


@dataclass(frozen=True)
class Follower:
    page: Callable[[PresentLink], object]  # the follower's page: the state now
    events: Callable[[PresentLink], Iterator[str]]  # SSE text: the state now, then the live rest, then `done`


def links() -> PresentLinks:
    return PresentLinks(glassbox().db)


def followed(token: str) -> tuple[PresentLink, Follower]:
    link = links().get(token)
    follower = glassbox().followers.get(link.kind) if link else None
    if link is None or follower is None:
        abort(404, GONE)
    return link, follower


@bp.get("/<token>")
def page(token: str):
    link, follower = followed(token)
    return follower.page(link)


@bp.get("/<token>/events")
def events(token: str):
    link, follower = followed(token)
    return event_stream(follower.events(link), follower=True)


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
    # following: the follow link a read-only view was opened through (a follower looking around on their own)
    return {"follow_address": follow_address, "following": g.get("follow_token")}


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
