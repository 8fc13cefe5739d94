"""/v1: OpenAI's API over the shared core. Views parse (webapp/v1/params.py) and hand the checked
request to webapp/v1/replies.py; errors of every kind leave in OpenAI's shape (webapp/v1/errors.py)."""

from __future__ import annotations

import time

from flask import current_app, jsonify, request

from webapp.v1 import params, replies, shapes
from webapp.v1.blueprint import bp
from webapp.v1.errors import ApiError, not_found_url
from webapp.web import get_core
from webapp.web.security import csrf_exempt

STARTED = int(time.time())  # a model's `created`: when this server loaded it


def chat_model():
    loaded = get_core().models.get("chat")
    if loaded is None:
        raise ApiError(404, "This server has no chat model loaded.", code="model_not_found")
    return loaded


def json_body() -> dict:
    try:
        body = request.get_json(silent=True)
    except RecursionError:  # silent=True catches ValueError only; nesting thousands deep is a client's error
        body = None
    if body is None:
        raise ApiError(400, "We could not parse the JSON body of your request: send a JSON object with "
                            "Content-Type: application/json.")
    return body


@bp.get("/models")
def models():
    loaded = get_core().models.get("chat")
    cards = [] if loaded is None else [shapes.model_card(params.MODEL_ID, loaded, STARTED)]
    return jsonify({"object": "list", "data": cards})


@bp.get("/models/<path:model>")
def model(model: str):
    if model != params.MODEL_ID:
        raise ApiError(404, f"The model '{model}' does not exist. This server has one model: "
                            f"'{params.MODEL_ID}'.", param="model", code="model_not_found")
    return jsonify(shapes.model_card(params.MODEL_ID, chat_model(), STARTED))


@bp.post("/chat/completions")
@csrf_exempt
def chat_completions():
    loaded = chat_model()
    return replies.respond(params.parse_chat(json_body(), loaded, current_app.config["GLASSBOX"]))


@bp.post("/completions")
@csrf_exempt
def completions():
    loaded = chat_model()
    return replies.respond(params.parse_text(json_body(), loaded, current_app.config["GLASSBOX"]))


@bp.route("/<path:rest>", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
@csrf_exempt
def unknown_url(rest: str):
    """Any other path under /v1, or a known one with the wrong method, as OpenAI answers it."""
    raise not_found_url()
