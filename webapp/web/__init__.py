"""Web glue shared by both demos: the core as Flask sees it, refusals as HTTP answers, streams.

Written once here, so the chat and the Loop lab answer a busy server, a full queue or a stream limit
the same way."""

from __future__ import annotations

import math

from flask import request
from werkzeug.exceptions import HTTPException

from webapp.core import InferenceCore, Refused
from webapp.web.state import glassbox

# A refusal's HTTP status: the browser's own limit is "too many requests"; the rest is the server's
# state, which passes ("service unavailable", with a hint when to retry).
STATUS_OF_REFUSAL = {"too_many": 429, "busy": 503, "closing": 503}
RETRY_AFTER_SECONDS = 5


def get_core() -> InferenceCore:
    return glassbox().core


def refusal_status(error: Refused) -> int:
    return STATUS_OF_REFUSAL.get(error.reason, 503)


def refusal_headers(error: Refused) -> dict[str, str]:
    return {"Retry-After": str(RETRY_AFTER_SECONDS)} if refusal_status(error) == 503 else {}


def retry_headers(error: HTTPException) -> dict[str, str]:
    """The Retry-After of an error that knows when to retry (werkzeug's TooManyRequests(retry_after=...))."""
    retry_after = getattr(error, "retry_after", None)
    return {"Retry-After": str(math.ceil(retry_after))} if isinstance(retry_after, (int, float)) else {}


def is_htmx() -> bool:
    """Whether htmx sent the request (it takes a fragment); otherwise a plain form or link (a page)."""
    return request.headers.get("HX-Request") == "true"
