"""Who is asking (an owner id in the signed session cookie), CSRF protection, and which proxies
may say where a request came from.

There are no accounts: a conversation or a trace belongs to the browser that made it.
Every state-changing request must carry the session's CSRF token, in the form field
`csrf_token` or the `X-CSRF-Token` header (htmx sends the header).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any, TypeVar

from flask import abort, current_app, request, session
from flask.sessions import SecureCookieSession, SecureCookieSessionInterface
from itsdangerous import BadSignature
from werkzeug.middleware.proxy_fix import ProxyFix

from webapp.config import ConfigError
from webapp.web import retention
from webapp.web.state import glassbox

View = TypeVar("View", bound=Callable[..., Any])
log = logging.getLogger("glassbox")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def owner_id() -> str:
    if "owner" not in session:
        glassbox().new_sessions.take(request.remote_addr or "")
        session["owner"] = secrets.token_urlsafe(18)
        session.permanent = True
        retention.record_made(session["owner"])
    return session["owner"]


# What nginx hashes to send each browser to one front end (deploy/nginx.conf, docs/scaling.md). Not the
# session cookie: its value changes with every response that re-signs it (its date, its contents). This
# one is the same for the browser's whole life: derived from its owner id with the secret key, so it says
# nothing of the owner, and is the same on every front end, and again if the browser loses it.
ROUTE_COOKIE = "glassbox_route"


def route_key(app, owner: str) -> str:
    return hmac.new(app.secret_key.encode(), b"route:" + owner.encode(), "sha256").hexdigest()[:16]


CLOCK_SKEW_SECONDS = 300  # a cookie dated this far ahead of the server's clock is taken without a word
# An unchanged cookie is signed again (its lifetime renewed) once it is this old, not on every response:
# signing and setting it cost more than many answers themselves, and a flood of requests pays it each time.
RESIGN_AFTER_SECONDS = 3600


class GlassboxSession(SecureCookieSession):
    signed_age: float | None = None  # how long ago the browser's cookie was signed; None: no cookie


class GlassboxSessions(SecureCookieSessionInterface):
    """The session cookie: `glassbox_session` (not Flask's `session`, which other apps on the host use),
    Path = the prefix the app lives under (X-Forwarded-Prefix from a trusted proxy, or SCRIPT_NAME),
    Secure when the request came over HTTPS (the scheme as a trusted proxy reports it).

    The cookie is the browser's only key to its conversations and traces, so it is refused (and a new
    owner made) only when its signature is not ours or it is older than GLASSBOX_SESSION_DAYS. Flask
    also refuses a cookie dated in the future, which is what a server clock stepping back produces:
    here a cookie signed by this key is kept whatever its date says, logged when more than
    CLOCK_SKEW_SECONDS ahead, and signed again with the clock's time on the response. An unchanged
    cookie is signed again once RESIGN_AFTER_SECONDS old (so an active browser's never runs out)."""

    session_class = GlassboxSession

    def open_session(self, app, request):
        serializer = self.get_signing_serializer(app)
        value = request.cookies.get(self.get_cookie_name(app))
        if serializer is None or not value:
            return super().open_session(app, request)
        try:
            data, signed_at = serializer.loads(value, return_timestamp=True)  # the signature only
        except BadSignature:
            return self.session_class()
        age = time.time() - signed_at.timestamp()
        if age > app.permanent_session_lifetime.total_seconds():
            log.warning("A session cookie signed %.0f days ago is past GLASSBOX_SESSION_DAYS: a new session "
                        "is started (if the server's clock jumped ahead, its browser's data is still stored)",
                        age / 86400)
            return self.session_class()
        if age < -CLOCK_SKEW_SECONDS:
            log.warning("A session cookie is signed %.0f s ahead of this server's clock: kept (has the clock "
                        "stepped back?)", -age)
        kept = self.session_class(data)
        kept.signed_age = age
        return kept

    def should_set_cookie(self, app, session) -> bool:
        if session.modified:
            return True
        age = getattr(session, "signed_age", None)
        stale = age is None or age > RESIGN_AFTER_SECONDS or age < -CLOCK_SKEW_SECONDS
        return bool(session.permanent and stale)

    def save_session(self, app, session, response) -> None:
        super().save_session(app, session, response)
        owner = session.get("owner")
        if owner and request.cookies.get(ROUTE_COOKIE) != route_key(app, owner):
            response.set_cookie(ROUTE_COOKIE, route_key(app, owner), max_age=app.permanent_session_lifetime,
                                path=self.get_cookie_path(app), secure=self.get_cookie_secure(app),
                                httponly=True, samesite="Lax")

    def get_cookie_path(self, app) -> str:
        return request.script_root or "/"

    def get_cookie_secure(self, app) -> bool:
        return request.is_secure


def csrf_token() -> str:
    if "csrf" not in session:
        session["csrf"] = secrets.token_urlsafe(24)
    return session["csrf"]


def csrf_exempt(view: View) -> View:
    """For JSON endpoints only: a cross-site page cannot send application/json without CORS."""
    setattr(view, "csrf_exempt", True)  # noqa: B010  (an attribute a function does not declare)
    return view


def csrf_json_or_form(view: View) -> View:
    """For endpoints that take a JSON body (no token needed: see csrf_exempt) or a form (with its token)."""
    setattr(view, "csrf_json_or_form", True)  # noqa: B010
    return view


def check_csrf() -> None:
    if request.method in SAFE_METHODS:
        return
    view = current_app.view_functions.get(request.endpoint or "")
    if getattr(view, "csrf_json_or_form", False) and request.is_json:
        return
    if getattr(view, "csrf_exempt", False):
        if request.is_json:
            return
        # A JSON endpoint sent a form or text: say what it takes (a cross-site form is refused either way)
        abort(415, "This endpoint takes JSON: send the body with Content-Type: application/json.")
    sent = request.headers.get("X-CSRF-Token") or request.form.get("csrf_token", "")
    expected = session.get("csrf", "")
    # as bytes: compare_digest refuses str with non-ASCII characters (a TypeError, a 500)
    if not expected or not hmac.compare_digest(sent.encode("utf-8", "surrogatepass"), expected.encode()):
        abort(403, "This form has expired. Reload the page and try again.")


FORWARDED = ("HTTP_X_FORWARDED_FOR", "HTTP_X_FORWARDED_PROTO", "HTTP_X_FORWARDED_HOST",
             "HTTP_X_FORWARDED_PORT", "HTTP_X_FORWARDED_PREFIX")


class TrustedProxies:
    """werkzeug's ProxyFix for requests from the configured proxies only: a peer on gunicorn's Unix
    socket (deploy/nginx.conf; the socket's group decides who may connect), or a TCP peer named in
    GLASSBOX_FORWARDED_ALLOW_IPS (addresses or networks, comma-separated, `*` for any; none by default,
    since trusting 127.0.0.1 trusts every local process). From anyone else the X-Forwarded-* headers
    are dropped, so a client cannot move the app's URLs (X-Forwarded-Prefix) or fake its address.
    The proxy's X-Forwarded-Prefix becomes SCRIPT_NAME: the app then lives at e.g. /glassbox/."""

    def __init__(self, wsgi_app, allow: str) -> None:
        self.wsgi_app = wsgi_app
        self.fixed = ProxyFix(wsgi_app, x_for=1, x_proto=1, x_host=0, x_port=0, x_prefix=1)
        entries = [a.strip() for a in allow.split(",") if a.strip()]
        self.everyone = "*" in entries
        self.warned = False
        try:
            self.networks = [ipaddress.ip_network(a, strict=False) for a in entries if a != "*"]
        except ValueError as error:
            raise ConfigError(f"GLASSBOX_FORWARDED_ALLOW_IPS={allow!r}: {error}") from None

    def trusted(self, address: str) -> bool:
        if self.everyone:
            return True
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:  # a Unix socket has no address: only a local proxy can reach it
            return address == "" or address.startswith("unix")
        return any(ip in network for network in self.networks)

    def __call__(self, environ, start_response):
        peer = environ.get("REMOTE_ADDR", "")
        if self.trusted(peer):
            return self.fixed(environ, start_response)
        if "HTTP_X_FORWARDED_FOR" in environ and not self.warned:
            # Once: a proxy over TCP that is not named (upgrading from a TCP upstream) sees every client
            # as itself, and the per-address limits count them all together.
            self.warned = True
            log.warning("X-Forwarded-For from %s ignored: not a trusted proxy (GLASSBOX_FORWARDED_ALLOW_IPS, "
                        "or reach gunicorn over its Unix socket as deploy/nginx.conf does)", peer)
        for header in FORWARDED:
            environ.pop(header, None)
        return self.wsgi_app(environ, start_response)
