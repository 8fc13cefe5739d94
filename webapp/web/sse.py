"""Server-Sent Events: the one place an event is framed and a job is streamed."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from flask import Response, current_app, render_template, request, stream_with_context
from werkzeug.exceptions import TooManyRequests

from webapp.core.jobs import AnyJob, Event
from webapp.web.state import glassbox
from webapp.web.streams import StreamSlot, long_response, take_slot

ROOM_FULL_RETRY_MS = 3000  # how soon the browser asks again for a stream its address had no slot for

_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # SSE's own line ends; str.splitlines() splits on more


def frame(event: str, data: str) -> str:
    """One SSE event: every line of the fragment is its own `data: ` line."""
    if "\r" in data:  # \r\n and a lone \r end lines too: make every line end \n
        data = _LINE_BREAK.sub("\n", data)
    # str.replace, not a split and join per line: much faster on a batch of Loop-lab rows
    # (docs/benchmarks-history.md, "Fast decoding (#5)")
    return f"event: {event}\ndata: " + data.replace("\n", "\ndata: ") + "\n\n"


def comment(text: str = "") -> str:
    """A comment line: ignored by the browser, but it flushes headers and probes the client."""
    return f": {_LINE_BREAK.sub(' ', text)}\n\n"


def sse_response(body: Iterator[str]) -> Response:
    """An SSE response that ends at once (nothing long-lived: no slot). Anything that waits or paces
    goes through `event_stream`, which holds a GLASSBOX_MAX_STREAMS slot."""
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return Response(stream_with_context(body), mimetype="text/event-stream", headers=headers)


def event_stream(body: Iterator[str], slot: StreamSlot | None = None, *, bulk: bool = False,
                 follower: bool = False) -> Response:
    """A long-lived SSE response, counted against GLASSBOX_MAX_STREAMS (webapp/web/streams.py); `bulk`
    (a replay) also against GLASSBOX_MAX_BULK_STREAMS; `follower` (a follow link's) against
    GLASSBOX_MAX_FOLLOWER_STREAMS instead."""
    return long_response(body, "text/event-stream", slot, bulk=bulk, follower=follower)


def stream_job(job: AnyJob, render: Callable[[Event], str | None],
               render_final: Callable[[AnyJob], str], *, watch: bool = False, follower: bool = False) -> Response:
    """Stream a job's events as HTML fragments and end with an explicit `done` event.

    `render` turns an event into a fragment (None skips it); `render_final` renders the
    finished job.  The `done` event is what makes the browser close instead of reconnecting.
    The stream holds one of GLASSBOX_MAX_STREAMS slots (503 when none is free), freed when the
    server closes the response, whatever ended it. `watch`: someone else's job, read-only (leaving it
    neither keeps it alive nor cancels it); `follower`: a follow link's, from the followers' pool.
    """
    settings = current_app.config["GLASSBOX"]
    return stream_events(job.subscribe_batches(settings.heartbeat_seconds, watch=watch), render,
                         lambda: render_final(job), follower=follower)


def stream_events(events: Iterator[Event | list[Event] | None], render: Callable[[Event], str | None],
                  render_final: Callable[[], str], *, follower: bool = False) -> Response:
    """Stream events as stream_job does, from any source: a job here, or a reply another front end runs,
    followed in the database (None: a heartbeat; a list: events that came together, as
    Job.subscribe_batches gives them). Ends with `done` and `render_final()` once they end."""

    def body() -> Iterator[str]:
        yield comment("open")  # gunicorn sends headers with the first chunk: send one now
        for item in events:
            if item is None:
                yield comment("heartbeat")
                continue
            # the events that came together (a step's tokens the stream was too slow for, a replay)
            # go out in one write: each still its own SSE event, in order
            batch = [item] if isinstance(item, Event) else item
            frames = [frame(event.name, html) for event in batch if (html := render(event)) is not None]
            if frames:
                yield "".join(frames)
        yield frame("done", render_final())

    try:
        slot = take_slot(follower=follower)
    except TooManyRequests:
        return room_full()
    glassbox().client_streams.arrived(request.remote_addr or "", request.path)
    return event_stream(body(), slot)


def room_full() -> Response:
    """A live stream this address has no slot for (GLASSBOX_MAX_STREAMS_PER_CLIENT: ten people behind one
    address): said in the reply's status, with how many of the address's streams wait, instead of a silent
    "Waiting for the model…"; the browser asks again in ROOM_FULL_RETRY_MS (the stream ends without `done`)."""
    settings = current_app.config["GLASSBOX"]
    waiting = glassbox().client_streams.waiting(request.remote_addr or "", request.path)
    html = render_template("_room_full.html", waiting=waiting, limit=settings.max_streams_per_client)
    return sse_response(iter([f"retry: {ROOM_FULL_RETRY_MS}\n\n", frame("position", html)]))


def finished_stream(html: str) -> Response:
    """The stream of something that finished before it was opened: its result, then close."""
    return sse_response(iter([comment("open"), frame("done", html)]))
