"""Request bodies: what one route may be sent, a body left unread drained before the answer, and a body
that cannot be read (a malformed chunk) answered 400 rather than 500.

gunicorn itself discards at most 64 KiB of a body the app did not read, then closes the connection,
although its answer announced keep-alive: nginx, which pools its connections to gunicorn, then sends
the next request (anyone's) into a closed socket and answers it 502. So whatever the answer (a 413, a
401 before the body was looked at, an error page), the body is read to its end first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from flask import abort, current_app, request
from werkzeug.exceptions import BadRequest, HTTPException, RequestEntityTooLarge

DRAIN_BYTES = 4 * 1024 * 1024  # over nginx's client_max_body_size (deploy/nginx.conf)
READ_BLOCK = 64 * 1024
UNREADABLE = ("The request body could not be read: a malformed chunk, or the connection broke while it "
              "was being sent.")


def body_limit(max_bytes: int) -> Callable:
    """A route's own body limit, under GLASSBOX_MAX_BODY_BYTES, applied before anything parses the body
    (the CSRF check reads the form): a form that can only be small is refused (413) before it costs the
    parsing and the rendering of whatever a script sent."""
    def mark(view: Callable) -> Callable:
        view.max_body_bytes = max_bytes  # type: ignore[attr-defined]
        return view
    return mark


def apply_body_limit() -> None:
    view = current_app.view_functions.get(request.endpoint or "")
    limit = getattr(view, "max_body_bytes", None)
    if limit is not None:
        request.max_content_length = min(limit, request.max_content_length or limit)


def refuse_chunked_over_limit() -> None:
    """A chunked body has no Content-Length to refuse it by before it is read, and werkzeug stops reading one at
    the limit and hands on what it read, cut short: a JSON or form parser then called it malformed (400). So a
    chunked body is read here, whole, and one that reaches the limit is a 413 (its rest drained after: drain_unread).
    The views read the cached copy."""
    limit = request.max_content_length
    if limit is None or request.content_length is not None or not request.environ.get("wsgi.input_terminated"):
        return
    if len(request.get_data(cache=True)) >= limit:
        raise RequestEntityTooLarge()


def refuse_lone_surrogates() -> None:
    """JSON's "\\ud800" escape decodes to a lone surrogate, which is not text: no tokenizer (and no UTF-8, so no
    database) takes it. A JSON body holding one anywhere is a 400 naming where, before a view sees it (/v1 says so
    in its own shape, field by field: webapp/v1/params.py); so is one nested too deep to parse. The parsed body
    is cached for the view."""
    if not request.is_json or request.blueprint == "v1":
        return
    try:
        body = request.get_json(silent=True)
    except RecursionError:  # silent=True catches ValueError only
        abort(400, "The JSON body is nested too deeply to read.")
    where = lone_surrogate(body)
    if where is not None:
        abort(400, f"{where} holds a lone surrogate (a \\ud800–\\udfff escape without its pair), which is not "
                   "text: send the text as UTF-8.")


def lone_surrogate(body: object) -> str | None:
    """Where the first string (or key) of a parsed JSON value that is not valid Unicode is ("'corrupted'",
    "'steer[0].direction'", "A key of 'steer[0]'", "The body") -> None when there is none. A loop, not
    recursion: a body nested as deep as the parser allows is walked too."""
    stack: list[tuple[object, str]] = [(body, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            if not _is_text(value):
                return repr(where) if where else "The body"
            continue
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in reversed(list(items)):
            if isinstance(key, str) and not _is_text(key):
                return f"A key of {where!r}" if where else "A key"
            stack.append((item, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else key))
    return None


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def drain_unread() -> None:
    """Read and drop what is left of the request body (up to DRAIN_BYTES) before answering."""
    environ = request.environ
    length, chunked = request.content_length, bool(environ.get("wsgi.input_terminated"))
    if not length and not chunked:
        return
    # werkzeug's stream (cached once the view or the CSRF check read the body) knows where the body ends;
    # before it exists nothing was read, and the raw input is read up to the body's length.
    opened = request.__dict__.get("stream")
    source = opened if opened is not None else environ.get("wsgi.input")
    left = DRAIN_BYTES if opened is not None or not length else min(length, DRAIN_BYTES)
    try:
        while source is not None and left > 0:
            chunk = source.read(min(left, READ_BLOCK))
            if not chunk:
                return
            left -= len(chunk)
    except (HTTPException, OSError, ValueError):  # past the limit, malformed, or the client went away
        return


class ReadableInput:
    """wsgi.input whose read errors are the client's to hear: gunicorn raises its own parse errors (an
    invalid chunk size) from a read, which would otherwise be a 500. Raised as a 400 with a message."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _guarded(self, method: Callable, *args: Any) -> Any:
        try:
            return method(*args)
        except HTTPException:
            raise
        except Exception as error:  # whatever the server's reader raises: the body is unusable
            raise BadRequest(UNREADABLE) from error

    def read(self, *args: Any) -> bytes:
        return self._guarded(self._stream.read, *args)

    def readline(self, *args: Any) -> bytes:
        return self._guarded(self._stream.readline, *args)

    def readlines(self, *args: Any) -> list[bytes]:
        return self._guarded(self._stream.readlines, *args)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.readline, b"")


class ReadableBodies:
    """WSGI middleware: every request's wsgi.input is a ReadableInput."""

    def __init__(self, wsgi_app: Callable) -> None:
        self.wsgi_app = wsgi_app

    def __call__(self, environ: dict, start_response: Callable) -> Any:
        if environ.get("wsgi.input") is not None:
            environ["wsgi.input"] = ReadableInput(environ["wsgi.input"])
        return self.wsgi_app(environ, start_response)
