"""The home page and how errors are shown (a page, an htmx fragment, or JSON for the API)."""

from collections.abc import Callable

from flask import Blueprint, Response, abort, render_template, request
from flask.globals import request_ctx
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import BadHost, HTTPException, RequestEntityTooLarge

from webapp.web import RETRY_AFTER_SECONDS, retry_headers

bp = Blueprint("pages", __name__)


@bp.get("/")
def home():
    return render_template("home.html")


TOO_LARGE_FOR_PROXY = ("This request is too large: it is far over what the form can hold, so the server refused it "
                       "before reading it.")


@bp.get("/too-large")
def too_large():
    """The page nginx shows for a body over its own limit (deploy/nginx.conf, error_page 413): the app's
    message and layout (an htmx fragment for htmx) instead of nginx's bare page; the body never reached us."""
    abort(413, description=TOO_LARGE_FOR_PROXY)


BAD_HOST = "The Host header is not a valid host name (each dot-separated part holds at most 63 characters)."
# Forms that say "too large" on their own page, beside their field, rather than on an error page that
# loses the form: endpoint -> a view given the limit in KiB. Their blueprints register them.
INLINE_TOO_LARGE: dict[str, Callable[[int], ResponseReturnValue]] = {}


def http_error(error: HTTPException):
    message = error.description or error.name
    if isinstance(error, RequestEntityTooLarge):  # its body is drained after the answer is made (bodies.py)
        limit_kib = (request.max_content_length or 0) // 1024
        inline = INLINE_TOO_LARGE.get(request.endpoint or "")
        if inline is not None:
            return inline(limit_kib)
        if message == RequestEntityTooLarge.description:
            message = f"This request is too large: the limit is {limit_kib:,} KiB."
    if isinstance(error, BadHost):
        message = BAD_HOST
    if request_ctx.url_adapter is None:  # the Host could not be read, so no URL (no page) can be built
        return Response(f"{error.code} {error.name}: {message}\n", error.code, mimetype="text/plain")
    # 503 is always the server's passing state (busy, shutting down, no stream free): say when to retry
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if error.code == 503 else {}
    headers.update(retry_headers(error))  # a 429 that knows when (webapp/web/heavy.py)
    # JSON for a script: an API route, any URL that names a .json answer, or a client that asks for it
    if (request.path.startswith("/api/") or request.path.endswith(".json")
            or request.accept_mimetypes.best == "application/json"):
        return {"error": message}, error.code, headers
    if request.headers.get("HX-Request") == "true":
        # Shown in the page's alert area, whatever the request's own target was.
        headers.update({"HX-Retarget": "#flash", "HX-Reswap": "innerHTML"})
        return render_template("_error_fragment.html", message=message), error.code, headers
    return render_template("error.html", code=error.code, name=error.name, message=message), error.code, headers
