"""The one place a long-lived response is counted: every stream, replay, NDJSON run and no-JavaScript
wait holds one of GLASSBOX_MAX_STREAMS slots, because each holds a gunicorn thread for its whole life.

gunicorn has GLASSBOX_MAX_STREAMS + 8 threads (gunicorn.conf.py): as long as nothing long-lived runs
without a slot, the 8 left over always answer page loads, however many streams a script opens.
"""

from __future__ import annotations

import threading
from typing import Iterator

from flask import Response, abort, current_app, stream_with_context

from webapp.web import get_core

STREAMS_FULL = "Too many open streams; reload the page in a moment."


class StreamSlot:
    """One slot, released exactly once whichever exit path gets there first (the body's end, the
    server closing a response whose body never ran, an exception in a no-JavaScript wait)."""

    def __init__(self, core) -> None:
        self._core = core
        self._released = threading.Lock()

    def release(self) -> None:
        if self._released.acquire(blocking=False):
            self._core.stream_opened(-1)

    def __enter__(self) -> "StreamSlot":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def take_slot() -> StreamSlot:
    """A slot, or a 503 with Retry-After (pages.http_error adds it to every 503) when none is free.
    Take it before queueing anything, so a refusal leaves nothing behind."""
    core = get_core()
    if not core.take_stream_slot(current_app.config["GLASSBOX"].max_streams):
        abort(503, STREAMS_FULL)
    return StreamSlot(core)


def long_response(body: Iterator[str], mimetype: str, slot: StreamSlot | None = None) -> Response:
    """A streamed response that holds a slot (taken here unless given) until the server closes it."""
    slot = slot or take_slot()

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
