"""The home page and how errors are shown (a page, an htmx fragment, or JSON for the API)."""

from flask import Blueprint, current_app, render_template, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from webapp.web import RETRY_AFTER_SECONDS

bp = Blueprint("pages", __name__)


@bp.get("/")
def home():
    return render_template("home.html")


DRAIN_BYTES = 4 * 1024 * 1024  # over nginx's client_max_body_size (deploy/nginx.conf)


def http_error(error: HTTPException):
    message = error.description or error.name
    if isinstance(error, RequestEntityTooLarge):
        drain_body()
        if message == RequestEntityTooLarge.description:
            limit_kib = current_app.config["MAX_CONTENT_LENGTH"] // 1024
            message = f"This request is too large: the limit is {limit_kib:,} KiB."
    # 503 is always the server's passing state (busy, shutting down, no stream free): say when to retry
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if error.code == 503 else {}
    if request.path.startswith("/api/") or (request.accept_mimetypes.best == "application/json"):
        return {"error": message}, error.code, headers
    if request.headers.get("HX-Request") == "true":
        # Shown in the page's alert area, whatever the request's own target was.
        headers.update({"HX-Retarget": "#flash", "HX-Reswap": "innerHTML"})
        return render_template("_error_fragment.html", message=message), error.code, headers
    return render_template("error.html", code=error.code, name=error.name, message=message), error.code, headers


def drain_body() -> None:
    """Read and drop an unread request body (up to DRAIN_BYTES) before answering. A server that closes a
    connection with bytes still unread makes the kernel reset it, and a proxy still sending the body
    then reports 502 instead of the answer."""
    stream, left = request.environ.get("wsgi.input"), min(request.content_length or 0, DRAIN_BYTES)
    while stream is not None and left > 0:
        chunk = stream.read(min(left, 64 * 1024))
        if not chunk:
            return
        left -= len(chunk)

