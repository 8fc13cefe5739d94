"""Server-Sent Events: the one place an event is framed and a job is streamed."""

from __future__ import annotations

import re
import threading
from typing import Callable, Iterator

from flask import Response, abort, current_app, stream_with_context

from webapp.core.jobs import Event, Job
from webapp.web import get_core

STREAMS_FULL = "Too many open streams; reload the page in a moment."

_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # SSE's own line ends; str.splitlines() splits on more


def frame(event: str, data: str) -> str:
    """One SSE event: every line of the fragment is its own `data: ` line."""
    if "\r" in data:  # \r\n and a lone \r end lines too: make every line end \n
        data = _LINE_BREAK.sub("\n", data)
    # str.replace, not a split and join per line: 8x faster on a batch of Loop-lab rows
    return f"event: {event}\ndata: " + data.replace("\n", "\ndata: ") + "\n\n"


def comment(text: str = "") -> str:
    """A comment line: ignored by the browser, but it flushes headers and probes the client."""
    return f": {_LINE_BREAK.sub(' ', text)}\n\n"


def sse_response(body: Iterator[str]) -> Response:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return Response(stream_with_context(body), mimetype="text/event-stream", headers=headers)


def stream_job(job: Job, render: Callable[[Event], str | None],
               render_final: Callable[[Job], str]) -> Response:
    """Stream a job's events as HTML fragments and end with an explicit `done` event.

    `render` turns an event into a fragment (None skips it); `render_final` renders the
    finished job.  The `done` event is what makes the browser close instead of reconnecting.
    The stream holds one of GLASSBOX_MAX_STREAMS slots (503 when none is free), freed when the
    server closes the response, whatever ended it.
    """
    core, settings = get_core(), current_app.config["GLASSBOX"]
    if not core.take_stream_slot(settings.max_streams):
        abort(503, STREAMS_FULL)

    released = threading.Lock()

    def release() -> None:  # once: when the body ends, or when the server closes a body never started
        if released.acquire(blocking=False):
            core.stream_opened(-1)

    def body() -> Iterator[str]:
        try:
            yield comment("open")  # gunicorn sends headers with the first chunk: send one now
            for event in job.subscribe(settings.heartbeat_seconds):
                if event is None:
                    yield comment("heartbeat")
                    continue
                html = render(event)
                if html is not None:
                    yield frame(event.name, html)
            yield frame("done", render_final(job))
        finally:
            release()

    response = sse_response(body())
    response.call_on_close(release)
    return response


def finished_stream(html: str) -> Response:
    """The stream of something that finished before it was opened: its result, then close."""
    return sse_response(iter([comment("open"), frame("done", html)]))
