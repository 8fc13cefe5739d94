"""Steering (webapp/chat/steering/service.py): directions made from two lists of prompts or imported, listed per model,
exported as llama.cpp control vectors; and a reply written again with directions added to its residual
stream, as a new version beside the original (a form, and its JSON twin). Directions belong to the server's
models; steering a reply is the owner's only."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import numpy as np
from flask import Response, abort, jsonify, redirect, render_template, request, url_for
from safetensors.torch import load as safetensors_load

from webapp.chat.inside.waiting import InsideError, wait_for_job
from webapp.chat.records import ChatPage, Conversation, Message
from webapp.chat.service import ChatError
from webapp.chat.steering.compute import read_control_vector, write_control_vector
from webapp.chat.steering.service import SteeringService
from webapp.chat.web.blueprint import bp, owned_message, owned_page, service
from webapp.chat.web.composer import start_reply, start_version_json
from webapp.web.security import csrf_json_or_form, owner_id
from webapp.web.state import glassbox

MAX_IMPORT_BYTES = 16 * 2**20  # a control vector file: a few blocks of the model's width in float32


def steering() -> SteeringService:
    return glassbox().service(SteeringService)


@bp.app_context_processor
def steering_context() -> dict:
    """steerable(message): whether the model that wrote a reply can be steered here (its Steer form); asked of
    the models in memory, never of the database, so a page costs no statement more."""
    def steerable(message: Message) -> bool:
        try:
            steering().model(service().writer_name(message))
        except ChatError:
            return False
        return True
    return {"steerable": steerable}


# -- directions ------------------------------------------------------------------------------------
@bp.post("/directions.json")
@csrf_json_or_form
def make_direction():
    """{"model", "name", "layer", "positive": [prompts], "negative": [prompts]} (contrastive),
    {"model", "name", "layer", "vector": [floats]} (imported) or {"model", "name", "feature": {"dictionary",
    "index"}} (a dictionary feature's decoder row) -> 201 the direction with its vector."""
    body = request.get_json(silent=True) if request.is_json else None
    if not isinstance(body, dict):
        return jsonify({"error": 'Send a JSON object: {"model", "name", "layer", "positive": [...], "negative": '
                                 '[...]} or {"model", "name", "layer", "vector": [...]}.'}), 400
    try:
        direction = made(body)
    except ChatError as error:
        return jsonify({"error": str(error)}), error.status
    except InsideError as error:
        return jsonify({"error": str(error)}), error.status, error.headers
    return jsonify(direction.as_json()), 201


def made(fields: dict):
    """A new direction from a JSON body's or a form's fields. Raises ChatError (400, 404, 409) or, from the
    job that works a contrastive one out, InsideError (429/503 refused or too slow, 500 failed)."""
    steer = steering()
    model, loaded = steer.model(fields.get("model"))
    if "feature" in fields:  # a dictionary feature's decoder row, after the dictionary's block
        layer, vector, made_from = steer.feature(loaded, fields["feature"])
        return steer.save(owner_id(), model, fields.get("name"), layer, vector, made_from)
    layer = steer.layer(loaded, fields.get("layer"))
    if "vector" in fields:
        vector = steer.vector(loaded, fields.get("vector"))
        how: dict[str, object] = {"kind": "imported", "from": str(fields.get("from", "a list of numbers"))[:200]}
    else:
        wanted = steer.contrastive_request(loaded, layer, fields.get("positive"), fields.get("negative"),
                                           fields.get("method"))
        job = wait_for_job(lambda: steer.start(owner_id(), model, wanted), "work this direction out", "vector")
        vector = list(job.result.vector)
        how = {"kind": "contrastive", "positive": fields.get("positive"), "negative": fields.get("negative"),
               "method": wanted.method,
               "read": "the residual stream after the block, at the last position of each prompt wrapped as "
                       "the chat template wraps a user message; " + (
                           "the mean of the positive less the mean of the negative" if wanted.method == "mean" else
                           "the first principal component of the pairs' differences, at the mean difference's "
                           "length along it")}
    return steer.save(owner_id(), model, fields.get("name"), layer, vector, how)


@bp.get("/directions.json")
def directions_json():
    """?model=<name> (default: the default model) -> {"model", "directions": [... without their vectors]}."""
    try:
        model, _ = steering().model(request.args.get("model"))
    except ChatError as error:
        return jsonify({"error": str(error)}), error.status
    return jsonify({"model": model, "directions": [d.as_json(with_vector=False) for d in steering().directions(model)]})


@bp.get("/directions/<model>/<name>.json")
def direction_json(model: str, name: str):
    try:
        return jsonify(steering().direction(model, name).as_json())
    except ChatError as error:
        return jsonify({"error": str(error)}), error.status


@bp.get("/directions/<model>/<name>.gguf")
def direction_gguf(model: str, name: str):
    """The direction as a llama.cpp control vector: `direction.L` for a direction after block L (L >= 1)."""
    try:
        direction = steering().direction(model, name)
    except ChatError as error:
        abort(error.status, str(error))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "direction.gguf"
        try:
            write_control_vector(path, {direction.layer: np.array(direction.vector, dtype=np.float32)}, "gpt2")
        except ValueError as error:
            abort(409, str(error))
        data = path.read_bytes()
    return Response(data, mimetype="application/octet-stream",
                    headers={"Content-Disposition": f'attachment; filename="{model}-{name}.gguf"'})


@bp.get("/directions")
def directions_page():
    """Every model's directions, how each was made, and the forms that make or import one."""
    steer = steering()
    listed = {name: steer.directions(name) for name in service().models.names()}
    return render_template("chat/directions.html", listed=listed, error=request.args.get("error"))


@bp.post("/directions")
def make_direction_form():
    """The Directions page's forms: a contrastive direction (one prompt a line on each side) or an imported
    llama.cpp control vector file (its block given, or the file's only one)."""
    fields: dict = {"model": request.form.get("model"), "name": request.form.get("name", "").strip()}
    try:
        fields["layer"] = int(request.form.get("layer", ""))
    except ValueError:
        fields["layer"] = request.form.get("layer")
    upload = request.files.get("file")
    try:
        if upload is not None and upload.filename:
            fields["vector"], fields["layer"] = imported(upload.read(MAX_IMPORT_BYTES + 1), fields["layer"],
                                                         upload.filename)
            fields["from"] = upload.filename
        else:
            fields["positive"] = lines(request.form.get("positive", ""))
            fields["negative"] = lines(request.form.get("negative", ""))
            fields["method"] = request.form.get("method")
        made(fields)
    except (ChatError, InsideError) as error:
        return redirect(url_for("chat.directions_page", error=str(error)))
    return redirect(url_for("chat.directions_page"))


def lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def imported(data: bytes, layer: object, filename: str = "") -> tuple[list[float], object]:
    """A direction from a file -> (vector, layer): a llama.cpp control vector (its one block, or the one
    named), or one vector in a .npy or .safetensors file (the block named). Raises ChatError (400)."""
    if len(data) > MAX_IMPORT_BYTES:
        raise ChatError(f"That file is larger than {MAX_IMPORT_BYTES // 2**20} MiB.", 400)
    if filename.endswith((".npy", ".safetensors")):
        if not isinstance(layer, int):
            raise ChatError("Say after which block the vector is added.", 400)
        return one_vector(data, filename), layer
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "import.gguf"
        path.write_bytes(data)
        try:
            found = read_control_vector(path)
        except ValueError as error:
            raise ChatError(f"That file is not a llama.cpp control vector: {error}.", 400) from None
    if not isinstance(layer, int):
        if len(found) != 1:
            raise ChatError(f"The file has directions for blocks {sorted(found)}: say which block to take.", 400)
        layer = next(iter(found))
    if layer not in found:
        raise ChatError(f"The file has no direction for block {layer} (it has {sorted(found)}).", 400)
    return [float(v) for v in found[layer]], layer


def one_vector(data: bytes, filename: str) -> list[float]:
    """The one vector of a .npy or .safetensors file. Raises ChatError (400)."""
    try:
        if filename.endswith(".npy"):
            array = np.load(io.BytesIO(data), allow_pickle=False)
        else:
            tensors = safetensors_load(data)
            if len(tensors) != 1:
                raise ChatError(f"That file holds {len(tensors)} tensors; give one with a single vector.", 400)
            array = next(iter(tensors.values())).float().numpy()
    except ChatError:
        raise
    except Exception as error:  # numpy and safetensors raise their own kinds (EOFError, SafetensorError, ...)
        raise ChatError(f"That file cannot be read as {filename.rsplit('.', 1)[-1]}: {str(error)[:200]}", 400) from None
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.number):
        raise ChatError(f"That file's array has shape {tuple(array.shape)}; a direction is one vector.", 400)
    return [float(v) for v in array]


@bp.post("/directions/<model>/<name>/delete")
def delete_direction(model: str, name: str):
    steering().delete(owner_id(), model, name)
    return redirect(url_for("chat.directions_page"))


# -- a reply, steered: a new version ---------------------------------------------------------------
@bp.post("/c/<conversation_id>/m/<int:message_id>/steer")
def steer_form(conversation_id: str, message_id: int):
    """direction=<name>, alpha=<number>: the reply written again with α · the direction added after its block."""
    page = owned_page(conversation_id)
    assert page.conversation is not None
    try:
        alpha = float(request.form.get("alpha", ""))
    except ValueError:
        abort(400, "alpha must be a number.")
    try:
        turn = steering().reply_turn(page.conversation, owned_message(conversation_id, message_id), page.messages,
                                     [{"direction": request.form.get("direction", ""), "alpha": alpha}])
    except ChatError as error:
        abort(error.status, str(error))
    return start_reply(turn, page, borrowed=True)


@bp.post("/c/<conversation_id>/m/<int:message_id>/steer.json")
@csrf_json_or_form
def steer_json(conversation_id: str, message_id: int):
    """{"steer": [{"direction": <name>, "alpha": <number>}, ...]} -> {"message_id": the new version}. Its stream
    is /chat/c/<c>/m/<id>/stream, as every reply's."""
    body = request.get_json(silent=True) if request.is_json else None
    if not isinstance(body, dict):
        return jsonify({"error": 'Send a JSON object: {"steer": [{"direction": <name>, "alpha": <number>}]}.'}), 400
    return start_version_json(lambda page: steering().reply_turn(
        _shown(page), owned_message(conversation_id, message_id), page.messages, body.get("steer")), conversation_id)


def _shown(page: ChatPage) -> Conversation:
    assert page.conversation is not None  # an owned page of a conversation
    return page.conversation
