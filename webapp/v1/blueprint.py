"""The /v1 blueprint: the API-key check in front of its routes (webapp/web/api_auth.py), no session for
/v1, and errors of every kind in OpenAI's shape.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, request
from flask.globals import request_ctx
from werkzeug.exceptions import HTTPException

from webapp.v1.errors import ApiError, error_response, from_http
from webapp.web.api_auth import CHALLENGE, require_key

bp = Blueprint("v1", __name__, url_prefix="/v1")


@bp.before_app_request
def _no_session() -> None:
    """Before the key check (below) and the app's own before-request functions: /v1 has no session."""
    if request.blueprint == bp.name:
        _without_session()


def _refuse(why: str, key_sent: bool) -> Response:
    return error_response(ApiError(401, why, code="invalid_api_key" if key_sent else None, headers=dict(CHALLENGE)))


require_key(bp, _refuse)


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
