"""The one place a long-lived response is counted: every stream, replay, NDJSON run and no-JavaScript
wait holds one of GLASSBOX_MAX_STREAMS slots, because each holds a gunicorn thread for its whole life.

One client address holds at most GLASSBOX_MAX_STREAMS_PER_CLIENT of them (429 past that), and the last quarter
of the slots is kept for addresses that hold none. A follow link's streams have a pool of their own,
GLASSBOX_MAX_FOLLOWER_STREAMS, so a room of followers never takes the presenter's or anyone else's. Replays of
saved traces, non-streamed /v1 calls and Inside reports being worked out ("bulk": nobody watches them
token by token, and each may hold its slot for many seconds) share at most GLASSBOX_MAX_BULK_STREAMS of
them, so a flood of those always leaves the rest to live replies. When they are all held, a few bulk requests
wait a moment for one (webapp/web/counts.py BulkShare) instead of being refused outright.
gunicorn has GLASSBOX_MAX_STREAMS + 8 threads (gunicorn.conf.py): as long as nothing long-lived runs
without a slot, the 8 left over always answer page loads, however many streams a script opens.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from flask import Flask, Response, abort, current_app, request, stream_with_context

from webapp.web import heavy
from webapp.web.counts import BulkShare, ClientStreams, OpenStreams
from webapp.web.state import glassbox

STREAMS_FULL = "Too many open streams; reload the page in a moment."
BULK_WAIT_SECONDS = 2.0  # how long a few bulk requests wait for a bulk slot before being refused (counts.py)


BULK_FULL = ("Too many replays and whole-reply API calls are running; try again in a moment "
             "(live replies keep their own slots).")
STREAMS_PER_CLIENT = ("This address already holds {n} open streams (GLASSBOX_MAX_STREAMS_PER_CLIENT). "
                      "Close a tab, or wait for a reply to end.")


def open_streams(app: Flask | None = None) -> OpenStreams:
    """The app's count of open streams, of GLASSBOX_MAX_STREAMS (the current app's unless given)."""
    return glassbox(app).open_streams


class StreamSlot:
    """One slot, released exactly once whichever exit path gets there first (the body's end, the
    server closing a response whose body never ran, an exception in a no-JavaScript wait)."""

    def __init__(self, streams: OpenStreams, clients: ClientStreams | None = None, client: str = "",
                 bulk: BulkShare | None = None) -> None:
        self._streams, self._clients, self._client, self._bulk = streams, clients, client, bulk
        self._released = threading.Lock()

    def release(self) -> None:
        if self._released.acquire(blocking=False):
            self._streams.give_back()
            if self._clients is not None:
                self._clients.give_back(self._client)
            if self._bulk is not None:
                self._bulk.give_back()

    def __enter__(self) -> StreamSlot:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def take_slot(bulk: bool = False, follower: bool = False) -> StreamSlot:
    """A slot, or a 503 with Retry-After (pages.http_error adds it to every 503) when none is free.
    Take it before queueing anything, so a refusal leaves nothing behind. `bulk`: a replay or a
    non-streamed API call, which also needs one of GLASSBOX_MAX_BULK_STREAMS. `follower`: a follow link's
    stream, from the followers' own pool (GLASSBOX_MAX_FOLLOWER_STREAMS), where one address (a room behind
    one NAT) may hold a quarter of it."""
    if bulk:
        heavy.bulk_request()
    state, settings = glassbox(), current_app.config["GLASSBOX"]
    pooled = follower and settings.max_follower_streams > 0
    streams = state.follower_streams if pooled else open_streams()
    clients = state.follower_clients if pooled else state.client_streams
    limit = settings.max_follower_streams if pooled else settings.max_streams
    per_client = max(settings.max_streams_per_client, limit // 4) if pooled else settings.max_streams_per_client
    share = state.bulk_streams if bulk else None
    client = request.remote_addr or ""
    newcomer = not per_client or clients.held(client) == 0  # no per-address limit: no slots kept for newcomers
    if not clients.take(client, per_client):
        abort(429, STREAMS_PER_CLIENT.format(n=per_client))
    if share is not None and not share.take(settings.max_bulk_streams, BULK_WAIT_SECONDS):
        clients.give_back(client)
        abort(503, BULK_FULL)
    if not streams.take(limit, newcomer):
        clients.give_back(client)
        if share is not None:
            share.give_back()
        abort(503, STREAMS_FULL)
    return StreamSlot(streams, clients, client, share)


@contextmanager
def held_slot(wanted: bool = True, *, bulk: bool = False) -> Iterator[StreamSlot | None]:
    """A slot (None when not `wanted`), taken before anything is queued so that a refusal leaves nothing
    behind, and given back if the block raises. After the block the caller holds it: `with slot:` around a
    wait in this request, or long_response(..., slot) for a stream."""
    slot = take_slot(bulk) if wanted else None
    try:
        yield slot
    except BaseException:
        if slot is not None:
            slot.release()
        raise


def long_response(body: Iterator[str], mimetype: str, slot: StreamSlot | None = None, *,
                  bulk: bool = False, follower: bool = False) -> Response:
    """A streamed response that holds a slot (taken here unless given) until the server closes it."""
    slot = slot or take_slot(bulk, follower)

    def held() -> Iterator[str]:
        try:
            yield from body
        finally:
            slot.release()

    try:
        response = Response(stream_with_context(held()), mimetype=mimetype,
                            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    except BaseException:
        slot.release()
        raise
    response.call_on_close(slot.release)
    return response
