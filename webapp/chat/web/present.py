"""Presenting a conversation (issue 31): "Present" makes a revocable follow link (webapp/present.py); its
followers see the branch shown, new messages, replies token by token and versions switched as they happen.

One job, many readers: a reply running here is followed by watching its job (Job.subscribe_batches(watch=True):
the tokens its presenter's stream gets, computed once); a reply another front end runs is followed in the
database (webapp/chat/follow.py), as the presenter's own stream would. A follower who joins late gets the
branch shown and the whole reply so far, then the live rest. Revoking ends every stream at its next check.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator

from flask import abort, redirect, render_template, request, stream_template, url_for

from webapp.chat.decode.publish import TokenEvent
from webapp.chat.service import ChatError
from webapp.chat.store import Status
from webapp.chat.web import token_views
from webapp.chat.web.blueprint import bp, owned_conversation, owned_message, service, settings
from webapp.chat.web.composer import render_message
from webapp.chat.web.pace import BadPace, paced, parse_pace, presentation_pace, replay_events
from webapp.core.jobs import Event
from webapp.present import CHANGES, FOLLOW_POLL_SECONDS, MAX_STATE_BYTES, PresentLink
from webapp.web import follow, is_htmx
from webapp.web.security import owner_id
from webapp.web.sse import comment, frame, stream_events
from webapp.web.streams import long_response

KIND = "chat"


def render_token(event: Event) -> str | None:
    """A streamed token as the presenter's stream renders it (chat/_token.html)."""
    if event.name != "token" or not isinstance(event.data, TokenEvent):
        return None
    odds = event.data.odds
    shade = token_views.shade(odds.probability) if odds and odds.probability is not None else None
    return render_template("chat/_token.html", text=event.data.text, shade=shade, odds=odds)


# -- the presenter --------------------------------------------------------------------------------
@bp.post("/c/<conversation_id>/present")
def present(conversation_id: str):
    owned_conversation(conversation_id)
    token = follow.links().make(owner_id(), KIND, conversation_id)
    return presented(conversation_id, token)


@bp.post("/c/<conversation_id>/unpresent")
def unpresent(conversation_id: str):
    owned_conversation(conversation_id)
    follow.links().revoke(owner_id(), KIND, conversation_id)
    CHANGES.notify(f"chat:{conversation_id}")  # followers here end at once
    return presented(conversation_id, None)


def presented(conversation_id: str, token: str | None):
    if is_htmx():
        return render_template("chat/_present.html", conversation_id=conversation_id, present_token=token)
    return redirect(url_for("chat.conversation", conversation_id=conversation_id, _anchor="present"), 303)


@bp.post("/c/<conversation_id>/present/state")
def present_state(conversation_id: str):
    """What the presenter's page shows now (static/follow.js reports it): the reply and token it points at."""
    owned_conversation(conversation_id)
    state = {name: request.form.get(name, "")[:200] for name in ("view", "message", "token")}
    if len(repr(state)) > MAX_STATE_BYTES:
        abort(400, "Too much state.")
    if not follow.links().report(owner_id(), KIND, conversation_id, state):
        abort(404, "This conversation is not being presented.")
    CHANGES.notify(f"chat:{conversation_id}")
    return "", 204


# -- replay ----------------------------------------------------------------------------------------
@bp.get("/c/<conversation_id>/m/<int:message_id>/replay")
def replay(conversation_id: str, message_id: int):
    """A saved reply again, at ?pace= tokens a second, from its stored tokens and odds: with JavaScript an
    SSE stream of the live stream's events (Stop closes it), without it the reply's page written as it goes.
    It holds a stream slot like any stream, and no worker time."""
    message = owned_message(conversation_id, message_id)
    if message["role"] != "assistant" or message["status"] == Status.PENDING:
        abort(409, "Only a finished reply can be replayed.")
    try:
        pace = parse_pace(request.args.get("pace"))
    except BadPace as error:
        abort(400, str(error))
    details = service().details(message_id)
    if not details.odds:
        abort(409, "This reply was saved without its tokens, so it cannot be replayed.")
    try:
        tokenizer = service().writer(message).tokenizer
    except ChatError as error:
        abort(error.status, str(error))
    events = replay_events(tokenizer, details.odds, pace)
    if "text/event-stream" not in request.headers.get("Accept", ""):
        pieces = (html for event in events if (html := render_token(event)) is not None)
        page = stream_template("chat/replay.html", conversation_id=conversation_id, message=message,
                               pieces=pieces, pace=pace)
        return long_response(page, "text/html")

    def render(event: Event) -> str | None:
        if event.name == "running":
            return render_template("chat/_reply_status.html", event=event)
        return render_token(event)

    return stream_events(events, render, lambda: render_message(conversation_id, message_id))


# -- the followers --------------------------------------------------------------------------------
def branch(conversation_id: str) -> list[dict]:
    return service().history(conversation_id)


def follow_page(link: PresentLink):
    conversation = service().store.conversation(link.owner, link.target)
    if conversation is None:
        abort(404, follow.GONE)
    return render_template("follow/chat.html", conversation=conversation, messages=branch(link.target),
                           token=link.token, state=link.state)


def follow_events(link: PresentLink) -> Iterator[str]:
    """The follower's stream: `conversation` (the branch shown, whenever it changes), `token` (the live
    reply's tokens), `player` (what the presenter points at), then `done` once the link is revoked."""
    links, token, cid = follow.links(), link.token, link.target
    key, heartbeat = f"chat:{cid}", settings().heartbeat_seconds
    pace = presentation_pace()
    shown: tuple | None = None
    state_version = -1
    seen = CHANGES.version(key)
    quiet_since = time.monotonic()
    yield comment("open")
    while True:
        now_link = links.get(token)
        messages = branch(cid) if now_link is not None else []
        if now_link is None or not messages and service().store.conversation(link.owner, cid) is None:
            yield frame("done", render_template("follow/_ended.html"))
            return
        if now_link.state_version != state_version:
            state_version = now_link.state_version
            yield frame("player", render_template("follow/_chat_player.html", state=now_link.state))
        now = tuple((m["id"], m["status"]) for m in messages)
        if now != shown:
            shown, quiet_since = now, time.monotonic()
            yield frame("conversation", render_template("follow/_chat_messages.html", messages=messages))
            live = messages[-1] if messages and messages[-1]["status"] == Status.PENDING else None
            if live is not None:
                ended = yield from follow_reply(links, token, live["id"], heartbeat, pace)
                if ended:
                    yield frame("done", render_template("follow/_ended.html"))
                    return
                shown = None  # its end: read the branch again, and send it finished
            continue
        seen = CHANGES.wait(key, seen, FOLLOW_POLL_SECONDS)
        if time.monotonic() - quiet_since >= heartbeat:
            quiet_since = time.monotonic()
            yield comment("heartbeat")


def follow_reply(links, token: str, message_id: int, heartbeat: float, pace: float) -> Generator[str, None, bool]:
    """A live reply's tokens, as they come -> (returned) whether the link was revoked meanwhile."""
    job = service().job_for(message_id)
    source = (job.subscribe_batches(FOLLOW_POLL_SECONDS, watch=True) if job is not None
              else service().follow(message_id, FOLLOW_POLL_SECONDS))  # another front end runs it
    checked = quiet_since = time.monotonic()
    try:
        for item in paced(source, pace):
            now = time.monotonic()
            if now - checked >= FOLLOW_POLL_SECONDS:
                checked = now
                if links.get(token) is None:
                    return True
            if item is None:
                if now - quiet_since >= heartbeat:
                    quiet_since = now
                    yield comment("heartbeat")
                continue
            batch = [item] if isinstance(item, Event) else item
            frames = [frame("token", html) for event in batch if (html := render_token(event)) is not None]
            if frames:
                quiet_since = now
                yield "".join(frames)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
    return False


follow.KINDS[KIND] = follow.Follower(follow_page, follow_events)
