"""What the presenter's page shows, for the room (issue 51): when the owner of a presented conversation opens
one of a reply's views (its tokens, Inside, a head, the lens, attribution), the follow link keeps which, and every
follower's page shows the same view, read-only, from the conversation's twin through the follow link itself
(/chat/shared/<follow token>/m/<message>/<path>: webapp/chat/web/share.py opens a follow link's conversation as
a share link's); a page of no conversation that anyone may open (a feature's) is shown as it is. Followers read
what the presenter's page worked out: they never start a job (webapp/chat/inside/waiting.py)."""

from __future__ import annotations

from typing import TypeVar
from urllib.parse import urlencode

from flask import request

from webapp.present import CHANGES
from webapp.web import follow
from webapp.web.security import owner_id

Page = TypeVar("Page")  # a view's answer, handed back as it is

KIND = "chat"  # the follow links of conversations (webapp/chat/web/present.py)


def show_followers(page: Page, conversation_id: str, message_id: int, path: str, label: str,
                   keep: tuple[str, ...] = ()) -> Page:
    """After the owner's page `page` rendered (an error page, a tuple, is not shown): if this conversation is
    presented, its followers show the view at `path` (under the message's twin), with the query arguments
    named in `keep` (the head picked, the token selected), called `label` -> `page`."""
    if isinstance(page, tuple) or request.headers.get("HX-Request"):  # an error page; a poll of a page shown
        return page
    query = urlencode({name: request.args[name] for name in keep if request.args.get(name)})
    state = {"view": "page", "message": str(message_id), "path": (path + (f"?{query}" if query else ""))[:200],
             "label": label[:200]}
    follow.presented_here(KIND, conversation_id)  # a presenting session shows it from now on
    if follow.links().report(owner_id(), KIND, conversation_id, state):
        CHANGES.notify(f"chat:{conversation_id}")
    return page


def show_followers_everywhere(page: Page, label: str) -> Page:
    """As show_followers, for a page of no conversation that anyone may open (a feature's): every conversation
    the owner presents, and their Loop lab, shows this very page (its path and query) to its followers."""
    if isinstance(page, tuple):
        return page
    state = {"view": "page", "url": request.full_path.rstrip("?")[:300], "label": label[:200]}
    for target in follow.links().report_all(owner_id(), KIND, state):
        CHANGES.notify(f"chat:{target}")
    follow.links().report_all(owner_id(), "loops", state)  # the Loop lab's followers too (a session showing it)
    return page
