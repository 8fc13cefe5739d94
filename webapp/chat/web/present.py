"""Presenting a conversation (issue 31): "Present" makes a revocable follow link (webapp/present.py); its
followers see the branch shown, new messages, replies token by token and versions switched as they happen.

One job, many readers: a reply running here is followed by watching its job (Job.subscribe_batches(watch=True):
the tokens its presenter's stream gets, computed once); a reply another front end runs is followed in the
database (webapp/chat/follow.py), as the presenter's own stream would. A follower who joins late gets the
branch shown and the whole reply so far, then the live rest. Revoking ends every stream at its next check.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from flask import abort, redirect, render_template, request, stream_template, url_for

from webapp.chat.decode.publish import TokenEvent
from webapp.chat.records import Message, Status
from webapp.chat.service import ChatError
from webapp.chat.web import token_views
from webapp.chat.web.blueprint import bp, owned_conversation, owned_message, service, settings
from webapp.chat.web.composer import render_message
from webapp.chat.web.pace import BadPace, paced, parse_pace, presentation_pace, replay_events, reply_tokens
from webapp.core.jobs import Event
from webapp.digits import plain_digits
from webapp.present import CHANGES, FOLLOW_POLL_SECONDS, MAX_STATE_BYTES, SESSION, PresentLink
from webapp.web import follow, is_htmx
from webapp.web.security import owner_id
from webapp.web.sse import comment, frame, stream_events
from webapp.web.streams import long_response

KIND = "chat"
# How long a follower waits after the presenter changes something before it reads the change: the followers'
# reads and renders (one for all, then a write each) would otherwise compete with the presenter's own request
SETTLE_SECONDS = 0.1
TOKEN_LAG_SECONDS = 0.01


def render_token(event: Event) -> str | None:
    """A streamed token as the presenter's stream renders it (chat/_token.html)."""
    if event.name != "token" or not isinstance(event.data, TokenEvent):
        return None
    odds = event.data.odds
    shade = token_views.shade(odds.probability) if odds and odds.probability is not None else None
    return render_template("chat/_token.html", text=event.data.text, shade=shade, odds=odds)


_RENDERED: dict[int, tuple[Event, str | None]] = {}  # a live token's HTML, rendered once for its followers
_RENDERED_LOCK = threading.Lock()


def shared_token(event: Event) -> str | None:
    """render_token, once per event whoever follows it (the event is kept with it, so its id is not reused)."""
    with _RENDERED_LOCK:
        kept = _RENDERED.get(id(event))
        if kept is not None and kept[0] is event:
            return kept[1]
    html = render_token(event)
    with _RENDERED_LOCK:
        if len(_RENDERED) > 4096:
            _RENDERED.clear()
        _RENDERED[id(event)] = (event, html)
    return html


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


def shown_state(conversation_id: str) -> dict:
    """What the owner's presented conversation shows its followers now ({}: not presented)."""
    links = follow.links()
    token = links.of(owner_id(), KIND, conversation_id)
    link = links.get(token) if token else None
    return link.state if link else {}


def presented(conversation_id: str, token: str | None):
    if is_htmx():
        return render_template("chat/_present.html", conversation_id=conversation_id, present_token=token,
                               present_session=follow.links().of(owner_id(), SESSION, ""))
    return redirect(url_for("chat.conversation", conversation_id=conversation_id, _anchor="present"), 303)


@bp.post("/c/<conversation_id>/present/state")
def present_state(conversation_id: str):
    """What the presenter's page shows now (static/follow.js reports it): the reply and token it points at."""
    owned_conversation(conversation_id)
    state = {name: request.form.get(name, "")[:200] for name in ("view", "message", "token")}
    if len(repr(state)) > MAX_STATE_BYTES:
        abort(400, "Too much state.")
    ended = request.form.get("ended")  # a replay's end: said only if it is still the replay shown
    if ended and shown_state(conversation_id).get("replay") != ended:
        return "", 204
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
    if message.role != "assistant" or message.status == Status.PENDING:
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
    start = time.monotonic()
    replay_id = request.args.get("replay", "")
    if plain_digits(replay_id) and len(replay_id) <= 20 and follow.links().report(  # the room replays it in step
            owner_id(), KIND, conversation_id, {"view": "replay", "message": str(message_id), "pace": f"{pace:g}",
                                                "started": f"{time.time():.3f}", "replay": replay_id}):
        CHANGES.notify(f"chat:{conversation_id}")
    events = replay_events(tokenizer, details.odds, pace, start)
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
def branch(conversation_id: str) -> list[Message]:
    return service().history(conversation_id)


def follow_page(link: PresentLink):
    conversation = service().store.conversation(link.owner, link.target)
    if conversation is None:
        abort(404, follow.GONE)
    return render_template("follow/chat.html", conversation=conversation, messages=branch(link.target),
                           token=link.token, state=link.state)


@dataclass(frozen=True)
class Snapshot:
    """What a conversation's followers are shown at one moment, read and rendered once for all of them."""

    gone: bool  # the link revoked, or the conversation deleted
    state_version: int = 0
    player: str = ""
    shown: tuple = ()  # (id, status) of each message of the branch shown
    conversation: str = ""
    live: int | None = None  # the reply being written
    replay: Replay | None = None  # the reply the presenter is replaying


@dataclass(frozen=True)
class Replay:
    """A replay the presenter started: its reply, pace (tokens a second) and start (time.time()), by which
    every follower writes token i at started + (i + 1)/pace, as the presenter's own stream does."""

    message: int
    pace: float
    started: float
    pieces: tuple[str, ...]  # each token's HTML, rendered once for every follower


_REPLAYS: dict[tuple, Replay] = {}
_REPLAYS_LOCK = threading.Lock()


def replay_shown(state: dict, shown: list[Message]) -> Replay | None:
    """The replay a follow link's state says the presenter runs, of a reply of the branch shown; else None."""
    if state.get("view") != "replay" or not plain_digits(state.get("message", "")):
        return None
    try:
        pace, started = parse_pace(state.get("pace")), float(state.get("started", ""))
    except (BadPace, ValueError):
        return None
    message = next((m for m in shown if m.id == int(state["message"]) and m.role == "assistant"), None)
    if message is None:
        return None
    key = (message.id, pace, started)
    with _REPLAYS_LOCK:
        if key in _REPLAYS:
            return _REPLAYS[key]
    odds = service().details(message.id).odds or []
    try:
        tokenizer = service().writer(message).tokenizer
    except ChatError:
        return None
    pieces = tuple(html for event in reply_tokens(tokenizer, odds) if (html := render_token(event)) is not None)
    with _REPLAYS_LOCK:
        if len(_REPLAYS) > 64:
            _REPLAYS.clear()
        return _REPLAYS.setdefault(key, Replay(message.id, pace, started, pieces))


def snapshot(links, token: str, owner: str, cid: str) -> Snapshot:
    """The link and the branch shown now."""
    link = links.get(token)
    if link is None:
        return Snapshot(gone=True)
    messages = branch(cid)
    if not messages and service().store.conversation(owner, cid) is None:
        return Snapshot(gone=True)
    live = messages[-1].id if messages and messages[-1].status == Status.PENDING else None
    player = render_template("follow/_chat_player.html", state=link.state, token=token)
    return Snapshot(False, link.state_version, player,
                    tuple((m.id, m.status) for m in messages),
                    render_template("follow/_chat_messages.html", messages=messages), live,
                    replay_shown(link.state, messages))


class SharedReads:
    """One read for every follower of a link: the first follower to look after a change here (or after
    FOLLOW_POLL_SECONDS, for what changes on another front end) reads and renders; the rest take its answer.
    Fifty followers woken by one new message then cost one read, not fifty, beside the presenter's reply."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[str, tuple[float, int, Snapshot]] = {}

    def read(self, token: str, version: int, fresh: Callable[[], Snapshot], ended: int | None = None,
             finished: Callable[[int], bool] = lambda message_id: False) -> Snapshot:
        """The snapshot of this version, kept or read now; `ended`: a reply the caller saw end, so a kept
        snapshot that shows it still live is read again; as is one whose live reply has `finished` (its job here
        ended: a follower who joins then sees it finished, not a snapshot read while it ran)."""
        with self._lock:
            kept = self._kept.get(token)
            if (kept and kept[1] == version and time.monotonic() - kept[0] < FOLLOW_POLL_SECONDS
                    and (ended is None or kept[2].live != ended)
                    and (kept[2].live is None or not finished(kept[2].live))):
                return kept[2]
            value = fresh()
            if len(self._kept) > 1000:  # links not followed any more
                self._kept.clear()
            self._kept[token] = (time.monotonic(), version, value)
            return value


SHARED = SharedReads()


def finished_here(message_id: int) -> bool:
    """Whether a reply's job on this front end has ended (one on another front end: not known here, so no)."""
    job = service().job_for(message_id)
    return job is not None and job.finished_state


def follow_events(link: PresentLink, moved: follow.Moved) -> Iterator[str]:
    """The follower's stream: `conversation` (the branch shown, whenever it changes), `token` (the live
    reply's tokens), `player` (what the presenter points at), until the link is revoked or `moved()`."""
    links, token, cid = follow.links(), link.token, link.target
    key, heartbeat = f"chat:{cid}", settings().heartbeat_seconds
    pace = presentation_pace()
    shown: tuple | None = None
    state_version = -1
    seen = CHANGES.version(key)
    quiet_since = time.monotonic()
    yield comment("open")
    ended: int | None = None
    replayed: tuple | None = None  # (reply, start) of the replay followed last: each is followed once

    def check() -> Snapshot:
        if moved():
            return Snapshot(gone=True)
        return SHARED.read(token, CHANGES.version(key), lambda: snapshot(links, token, link.owner, cid), ended,
                           finished_here)

    while True:
        now = check()
        if now.gone:
            return
        if now.state_version != state_version:
            state_version = now.state_version
            yield frame("player", now.player)
        if now.shown != shown:
            shown, quiet_since = now.shown, time.monotonic()
            yield frame("conversation", now.conversation)
            if now.live is not None:
                if (yield from follow_reply(now.live, heartbeat, pace, check)):
                    return
                shown, ended = None, now.live  # its end: read the branch again, and send it finished
            continue
        if now.replay is not None and (now.replay.message, now.replay.started) != replayed:
            replayed = now.replay.message, now.replay.started
            if (yield from follow_replay(now.replay, key, now.state_version, check)):
                return
            shown = None  # the reply whole again, as the presenter's page puts it back
            continue
        before, seen = seen, CHANGES.wait(key, seen, FOLLOW_POLL_SECONDS)
        if seen != before:  # the presenter's request first (a new message's reply, its first token), the room after
            time.sleep(SETTLE_SECONDS)
        if time.monotonic() - quiet_since >= heartbeat:
            quiet_since = time.monotonic()
            yield comment("heartbeat")


def follow_reply(message_id: int, heartbeat: float, pace: float,
                 check: Callable[[], Snapshot]) -> Generator[str, None, bool]:
    """A live reply's tokens, as they come -> (returned) whether the link was revoked (or the session that
    showed it moved on) meanwhile."""
    job = service().job_for(message_id)
    source = (job.subscribe_batches(FOLLOW_POLL_SECONDS, watch=True) if job is not None
              else service().follow(message_id, FOLLOW_POLL_SECONDS))  # another front end runs it
    checked = quiet_since = time.monotonic()
    try:
        for item in paced(source, pace):
            if item is not None:
                time.sleep(TOKEN_LAG_SECONDS)  # the presenter's stream takes its token first
            now = time.monotonic()
            if now - checked >= FOLLOW_POLL_SECONDS:
                checked = now
                if check().gone:
                    return True
            if item is None:
                if now - quiet_since >= heartbeat:
                    quiet_since = now
                    yield comment("heartbeat")
                continue
            batch = [item] if isinstance(item, Event) else item
            frames = [frame("token", html) for event in batch if (html := shared_token(event)) is not None]
            if frames:
                quiet_since = now
                yield "".join(frames)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
    return False


def follow_replay(replay: Replay, key: str, version: int,
                  check: Callable[[], Snapshot]) -> Generator[str, None, bool]:
    """The presenter's replay, in step with it: `replay` (the reply to clear), then each token when the
    presenter's stream writes it (a follower who joins late gets the tokens already written at once), until
    the last, or until the presenter moves on -> (returned) whether the link was revoked meanwhile."""
    yield frame("replay", str(replay.message))
    sent, seen = 0, CHANGES.version(key)
    while sent < len(replay.pieces):
        due = int((time.time() - replay.started) * replay.pace)  # the tokens the presenter's stream has written
        if due > sent:
            yield "".join(frame("replay-token", piece) for piece in replay.pieces[sent:due])
            sent = min(due, len(replay.pieces))
            continue
        wait = replay.started + (sent + 1) / replay.pace - time.time()
        seen = CHANGES.wait(key, seen, min(max(wait, 0.0), FOLLOW_POLL_SECONDS))
        now = check()
        if now.gone:
            return True
        if now.state_version != version:  # stopped, or another view: the follower's page follows
            return False
    return False


FOLLOWER = follow.Follower(follow_page, follow_events)  # how a conversation's follow link is followed
