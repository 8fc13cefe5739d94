"""The /v1 blueprint: its API-key check (also in front of /api/loops, so scripts use one key for both),
no session for /v1, and errors of every kind in OpenAI's shape.
"""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify, request
from flask.globals import request_ctx
from werkzeug.exceptions import HTTPException

from webapp.v1 import auth
from webapp.v1.errors import ApiError, error_response, from_http

bp = Blueprint("v1", __name__, url_prefix="/v1")
GUARDED = ("v1", "loops_api")  # the blueprints a key opens when keys are set


@bp.record_once
def _setup(state) -> None:
    # At registration, so a bad keys file stops start-up like a bad checkpoint does.
    state.app.extensions["glassbox.api_keys"] = auth.load(state.app.config["GLASSBOX"])


@bp.before_app_request
def _authenticate():
    """Runs before the app's CSRF check: a request without a valid key hears 401, whatever it sent."""
    if request.blueprint not in GUARDED:
        return None
    if request.blueprint == "v1":
        _without_session()
    owner, refusal = auth.authenticate()
    if owner is not None:
        return None
    auth.log.info("api request refused: %s", "no key" if auth.bearer_token() is None else "wrong key")
    headers = {"WWW-Authenticate": 'Bearer realm="glassbox"'}
    if request.blueprint == "v1":
        code = "invalid_api_key" if auth.bearer_token() is not None else None
        return error_response(ApiError(401, refusal or "Unauthorized", code=code, headers=headers))
    return jsonify({"error": refusal}), 401, headers  # the Loop-lab API's own error shape


def _without_session() -> None:
    """/v1 reads no cookie and sets none: a browser's session (its conversations, its owner) is not there
    to be seen, and an app calling the API is never handed a cookie. Flask keeps the opened session on
    the request context (`_session` since Flask 3.1, `session` before); a null session is never saved."""
    ctx = request_ctx._get_current_object()  # type: ignore[attr-defined]  # werkzeug's LocalProxy
    null = current_app.session_interface.make_null_session(current_app)
    if isinstance(getattr(type(ctx), "session", None), property):
        ctx._session = null
    else:
        ctx.session = null


bp.register_error_handler(ApiError, error_response)
bp.register_error_handler(HTTPException, lambda error: error_response(from_http(error)))
