"""Who is asking (an owner id in the signed session cookie) and CSRF protection.

There are no accounts: a conversation or a trace belongs to the browser that made it.
Every state-changing request must carry the session's CSRF token, in the form field
`csrf_token` or the `X-CSRF-Token` header (htmx sends the header).
"""

from __future__ import annotations

import hmac
import secrets

from flask import abort, current_app, request, session

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
