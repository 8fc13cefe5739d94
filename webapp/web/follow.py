"""Follow links' own pages (issue 31): `/follow/<token>`, the follower's page, and `/follow/<token>/events`,
its SSE stream. No cookie is needed: the token is the permission. The web layer does not know the demos:
each says how its kind of link is followed (a Follower: webapp/chat/web/present.py, webapp/loops/web/present.py)
and create_app hands them to the app's state (`Glassbox.followers`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from flask import Blueprint, abort

from webapp.present import PresentLink, PresentLinks
from webapp.web.sse import event_stream
from webapp.web.state import glassbox

bp = Blueprint("follow", __name__, url_prefix="/follow")

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
