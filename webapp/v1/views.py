"""/v1: OpenAI's API over the shared core. Views parse (webapp/v1/params.py) and hand the checked
request to webapp/v1/replies.py; errors of every kind leave in OpenAI's shape (webapp/v1/errors.py)."""

from __future__ import annotations

import dataclasses
import time

from flask import current_app, jsonify, request

from webapp.chat.registry import ChatModels
from webapp.chat.service import ChatError
from webapp.chat.steering.service import SteeringService
from webapp.v1 import params, replies, shapes
from webapp.v1.blueprint import bp
from webapp.v1.errors import ApiError, not_found_url
from webapp.v1.replies import chat_service
from webapp.web.security import csrf_exempt
from webapp.web.state import glassbox

STARTED = int(time.time())  # a model's `created`: when this server loaded it


def chat_models() -> ChatModels:
    models = chat_service().models
    if not models:
        raise ApiError(404, "This server has no chat model loaded.", code="model_not_found")
    return models


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
    registry = chat_service().models
    cards = [shapes.model_card(name, registry.get(name), STARTED) for name in registry.names()]
    return jsonify({"object": "list", "data": cards})


@bp.get("/models/<path:model>")
def model(model: str):
    registry = chat_models()
    if model not in registry:
        raise params.unknown_model(model, registry.names())
    return jsonify(shapes.model_card(model, registry.get(model), STARTED))


@bp.post("/chat/completions")
@csrf_exempt
def chat_completions():
    body, registry = json_body(), chat_models()
    loaded = registry.get(params.requested_model(body, registry.names()))
    ask = params.parse_chat(body, loaded, current_app.config["GLASSBOX"], registry.names())
    return replies.respond(steered(body, ask))


def steered(body: dict, ask: params.Ask) -> params.Ask:
    """Glassbox's extension: "glassbox": {"steer": [{"direction": <name>, "alpha": <number>}, ...]} adds the
    model's named directions to the residual stream in every forward (docs/api.md, "Steering")."""
    extension = body.get("glassbox")
    if extension is None:
        return ask
    if not isinstance(extension, dict):
        raise ApiError(400, "Invalid 'glassbox': expected an object, e.g. {\"steer\": [{\"direction\": \"name\", "
                            "\"alpha\": 4}]}.", param="glassbox")
    if extension.get("steer") is None:
        return ask
    steering = glassbox().service(SteeringService)
    try:
        name, loaded = steering.model(ask.model)
        terms, _ = steering.terms(name, loaded, extension["steer"])
    except ChatError as error:
        raise ApiError(error.status, str(error), param="glassbox.steer") from None
    return dataclasses.replace(ask, edit=steering.edit(loaded, terms))


@bp.post("/completions")
@csrf_exempt
def completions():
    body, registry = json_body(), chat_models()
    loaded = registry.get(params.requested_model(body, registry.names()))
    return replies.respond(params.parse_text(body, loaded, current_app.config["GLASSBOX"], registry.names()))


@bp.route("/<path:rest>", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
@csrf_exempt
def unknown_url(rest: str):
    """Any other path under /v1, or a known one with the wrong method, as OpenAI answers it."""
    raise not_found_url()
