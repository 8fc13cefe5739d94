"""Errors as OpenAI's API shapes them: `{"error": {"message", "type", "param", "code"}}` with the status
its clients expect (the openai package picks its exception class by status: 400 BadRequestError, 401
AuthenticationError, 404 NotFoundError, 429 RateLimitError, 5xx InternalServerError)."""

from __future__ import annotations

from flask import Response, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from webapp.core import Refused
from webapp.web import RETRY_AFTER_SECONDS, refusal_headers, refusal_status

# The `type` OpenAI gives each status; 429 is what it sends for a requests-per-minute limit.
TYPE_OF_STATUS = {400: "invalid_request_error", 401: "invalid_request_error", 403: "invalid_request_error",
                  404: "invalid_request_error", 405: "invalid_request_error", 413: "invalid_request_error",
                  415: "invalid_request_error", 429: "requests"}


class ApiError(Exception):
    """Raised anywhere below a /v1 view; answered by `error_response` (registered on the blueprint)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or TYPE_OF_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    @classmethod
    def refused(cls, error: Refused) -> ApiError:
        """The core's refusal (queue full, too many jobs of this client, shutting down), as the app maps it."""
        status = refusal_status(error)
        code = "rate_limit_exceeded" if status == 429 else error.reason
        return cls(status, str(error), code=code, headers=refusal_headers(error))


def error_response(error: ApiError) -> Response:
    response = jsonify(error.body())
    response.status_code = error.status
    response.headers.update(error.headers)
    return response


def from_http(error: HTTPException) -> ApiError:
    """Flask's own errors under /v1 (body too large, no stream free, a non-JSON body, a crash) in
    OpenAI's shape instead of the pages' HTML."""
    if request.endpoint == "v1.unknown_url":  # whatever else went wrong, this URL does not exist
        return not_found_url()
    status = error.code or 500
    message = error.description or error.name
    if isinstance(error, RequestEntityTooLarge):
        message = f"The request body is too large: the limit is {(request.max_content_length or 0) // 1024:,} KiB."
    elif status >= 500 and status != 503:
        message = "The server had an error while processing your request."  # the details are in the log
    # 503 is always the server's passing state here (no stream free, shutting down): say when to retry
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 503 else {}
    return ApiError(status, message, headers=headers)


def not_found_url() -> ApiError:
    # OpenAI's own words for an unknown path or a wrong method
    return ApiError(404, f"Invalid URL ({request.method} {request.path})")
