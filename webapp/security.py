"""Who is asking (an owner id in the signed session cookie), CSRF protection, and which proxies
may say where a request came from.

There are no accounts: a conversation or a trace belongs to the browser that made it.
Every state-changing request must carry the session's CSRF token, in the form field
`csrf_token` or the `X-CSRF-Token` header (htmx sends the header).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets

from flask import abort, current_app, request, session
from werkzeug.middleware.proxy_fix import ProxyFix

from webapp.config import ConfigError

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def owner_id() -> str:
    if "owner" not in session:
        session["owner"] = secrets.token_urlsafe(18)
        session.permanent = True
    return session["owner"]


def csrf_token() -> str:
    if "csrf" not in session:
        session["csrf"] = secrets.token_urlsafe(24)
    return session["csrf"]


def csrf_exempt(view):
    """For JSON endpoints only: a cross-site page cannot send application/json without CORS."""
    view.csrf_exempt = True
    return view


def check_csrf() -> None:
    if request.method in SAFE_METHODS:
        return
    view = current_app.view_functions.get(request.endpoint or "")
    if getattr(view, "csrf_exempt", False) and request.is_json:
        return
    sent = request.headers.get("X-CSRF-Token") or request.form.get("csrf_token", "")
    expected = session.get("csrf", "")
    if not expected or not hmac.compare_digest(sent, expected):
        abort(403, "This form has expired. Reload the page and try again.")


FORWARDED = ("HTTP_X_FORWARDED_FOR", "HTTP_X_FORWARDED_PROTO", "HTTP_X_FORWARDED_HOST",
             "HTTP_X_FORWARDED_PORT", "HTTP_X_FORWARDED_PREFIX")


class TrustedProxies:
    """werkzeug's ProxyFix for requests from the configured proxies only (GLASSBOX_FORWARDED_ALLOW_IPS:
    addresses or networks, comma-separated, `*` for any). From anyone else the X-Forwarded-* headers
    are dropped, so a client cannot move the app's URLs (X-Forwarded-Prefix) or fake its address.
    The proxy's X-Forwarded-Prefix becomes SCRIPT_NAME: the app then lives at e.g. /glassbox/."""

    def __init__(self, wsgi_app, allow: str) -> None:
        self.wsgi_app = wsgi_app
        self.fixed = ProxyFix(wsgi_app, x_for=1, x_proto=1, x_host=0, x_port=0, x_prefix=1)
        entries = [a.strip() for a in allow.split(",") if a.strip()]
        self.everyone = "*" in entries
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
        if self.trusted(environ.get("REMOTE_ADDR", "")):
            return self.fixed(environ, start_response)
        for header in FORWARDED:
            environ.pop(header, None)
        return self.wsgi_app(environ, start_response)
