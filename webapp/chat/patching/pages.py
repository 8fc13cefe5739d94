"""Patch from another question: activation patching between a reply's own context and the same with its
last user message edited (webapp/chat/patching/service.py), as a page whose two heat maps fill in live (htmx SSE,
one fragment per batch of cells) and work without JavaScript (the page reloads itself while the job
runs), and as JSON (docs/api.md). The owner's only."""

from __future__ import annotations

from typing import Any, cast

from flask import abort, g, jsonify, redirect, render_template, request, url_for
from werkzeug.exceptions import NotFound

from webapp.chat.decode.odds import TokenOdds
from webapp.chat.inside.waiting import NOT_SHOWN, InsideError, inside_service, report_or_wait, runnable_writer
from webapp.chat.patching import view as patching_view
from webapp.chat.patching.compute import Cells, Patching, first_difference
from webapp.chat.patching.jobs import PatchingMetrics, PatchingRequest
from webapp.chat.patching.service import PatchingService
from webapp.chat.records import Message
from webapp.chat.service import ChatError
from webapp.chat.web.blueprint import bp, owned_conversation, owned_message, service
from webapp.chat.web.presenter_view import show_followers
from webapp.chat.web.share import shared_message
from webapp.chat.web.token_views import token_text
from webapp.core import Refused
from webapp.core.jobs import FINISHED, AnyJob
from webapp.digits import plain_digits
from webapp.web import refusal_headers, refusal_status
from webapp.web.security import csrf_exempt, owner_id
from webapp.web.sse import finished_stream, stream_job
from webapp.web.state import glassbox


def patching_service() -> PatchingService:
    return glassbox().service(PatchingService)


def checked(message: Message, index: int, corrupted: object, against: object,
            estimate: object = False) -> tuple[str, PatchingRequest]:
    """(model, request), or InsideError: 404, 409 (as Inside: not here, not finished, cannot look into
    it), 400 (bad input, contexts of different lengths)."""
    model = runnable_writer(message, "Patching cannot run on")
    try:
        return model, patching_service().request_for(message, service().details(message.id), index,
                                                     corrupted, against, estimate)
    except ChatError as error:
        raise InsideError(str(error), error.status) from None


def start(model: str, patching_request: PatchingRequest, watched: bool = False) -> AnyJob:
    try:
        job = patching_service().start(owner_id(), model, patching_request)
    except Refused as error:
        raise InsideError(str(error), refusal_status(error), refusal_headers(error)) from None
    if watched:  # a page without JavaScript follows it by reloading, never subscribing
        job.watched_elsewhere()
    return job


@bp.post("/c/<conversation_id>/m/<int:message_id>/patching/<int:index>.json")
@csrf_exempt
def patching_json(conversation_id: str, message_id: int, index: int):
    """Body {"corrupted": text, "against": token id, "estimate": false} -> the whole map once worked out
    (the request waits, holding a bulk stream slot, at most GLASSBOX_INSIDE_WAIT_SECONDS); with
    "estimate": true, its first-order estimate, in the same shape, at the cost of a backward pass."""
    message = owned_message(conversation_id, message_id)  # its errors as JSON too (pages.http_error)
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        return jsonify({"error": 'Send a JSON object: {"corrupted": "<the message>", "against": <token id>}.'}), 400
    try:
        model, patching_request = checked(message, index, body.get("corrupted"), body.get("against"),
                                          body.get("estimate", False))
        found = report_or_wait(patching_service(), model, patching_request, "patch", "patching")
    except InsideError as error:
        return jsonify({"error": str(error)}), error.status, error.headers
    tokenizer = service().writer(message).tokenizer
    return jsonify(patching_view.as_json(tokenizer, patching_request, found))


def form_values() -> tuple[str | None, object]:
    """?corrupted=...&against=<id> (or &against_text=<one token's text>) of the form."""
    corrupted = request.args.get("corrupted")
    against: object = request.args.get("against", "")
    typed = request.args.get("against_text", "")
    if typed:
        against = ("text", typed)
    elif isinstance(against, str) and plain_digits(against.removeprefix("-")):
        against = int(against)
    return corrupted, against


@bp.get("/c/<conversation_id>/m/<int:message_id>/patching/<int:index>")
def patching(conversation_id: str, message_id: int, index: int):
    """The form (no ?corrupted), else the maps: kept, being worked out, or started now."""
    conversation = owned_conversation(conversation_id)
    message = owned_message(conversation_id, message_id)
    details = service().details(message.id)
    corrupted, against = form_values()
    common = {"conversation": conversation, "message": message, "index": index}
    try:
        loaded = service().writer(message)
    except ChatError as error:
        return render_template("chat/patching.html", problem=str(error), **common), error.status
    tokenizer = loaded.tokenizer
    odds = details.odds or []
    if not 0 <= index < len(odds):
        abort(404, "No such token in this reply.")
    panel = TokenOdds.from_row(odds[index])
    if isinstance(against, tuple):  # a typed token: it must be exactly one
        ids = tokenizer.encode_ordinary(against[1])
        against = ids[0] if len(ids) == 1 else "typed"
    form = patching_view.form_view(tokenizer, panel, patching_service().last_user_message(details),
                                   corrupted, against)
    common.update(form=form, token_text=token_text(tokenizer, panel.token)[0])
    if corrupted is None:
        return render_template("chat/patching.html", problem=None, **common)
    if against == "typed":
        return render_template("chat/patching.html", problem="Type exactly one token as the alternative "
                               "(that text is several tokens, or none).", **common), 400
    try:
        model, patching_request = checked(message, index, corrupted, against)
        kept = patching_service().report(model, patching_request)
        job = None
        left = False  # this browser pressed Stop while another still wants the map: its page stops there
        if kept is None:
            job = patching_service().job(model, patching_request)
            stopped = job is not None and request.args.get("stopped") and (
                job.state in FINISHED or not job.asked_by(owner_id()))
            left = bool(stopped) and job is not None and job.state not in FINISHED
            if not stopped:
                job = start(model, patching_request, watched=True)
    except InsideError as error:
        if error.status == 404:
            abort(404, str(error))
        return render_template("chat/patching.html", problem=str(error), **common), error.status, error.headers
    view = patching_view.maps_view(tokenizer, patching_request, kept or current(job), job, loaded.model.config,
                                   left=left)
    page = render_template("chat/patching.html", problem=None, view=view, job=job,
                           stream_url=url_for("chat.patching_stream", conversation_id=conversation_id,
                                              message_id=message_id, index=index, corrupted=corrupted,
                                              against=patching_request.against),
                           stop_url=url_for("chat.patching_stop", conversation_id=conversation_id,
                                            message_id=message_id, index=index, job_id=job.id) if job else None,
                           **common)
    key = patching_service().name(model, patching_request, corrupted)
    return show_followers(page, conversation_id, message_id, f"patching/{index}/{key}",
                          f"patching token {index + 1}")


@bp.get("/shared/<token>/m/<int:message_id>/patching/<int:index>/<key>")
def shared_patching(token: str, message_id: int, index: int, key: str):
    """A map the presenter opened, read-only, filling in as their job works it out: the room never starts,
    stops or changes one."""
    conversation, message = shared_message(token, message_id)
    model, patching_request, corrupted = shown_map(message, index, key)
    loaded = service().writer(message)
    kept = patching_service().report(model, patching_request)
    job = None if kept is not None else patching_service().job(model, patching_request)
    common = {"conversation": conversation, "message": message, "index": index, "shared": token,
              "corrupted": corrupted, "token_text": token_text(loaded.tokenizer, patching_request.chosen)[0]}
    if kept is None and job is None:
        return render_template("chat/patching.html", problem=NOT_SHOWN, **common), 409
    view = patching_view.maps_view(loaded.tokenizer, patching_request, kept or current(job), job,
                                   loaded.model.config)
    stream_url = url_for("chat.shared_patching_stream", token=token, message_id=message_id, index=index, key=key)
    return render_template("chat/patching.html", problem=None, view=view, job=job, stream_url=stream_url,
                           stop_url=None, **common)


@bp.get("/shared/<token>/m/<int:message_id>/patching/<int:index>/<key>/stream")
def shared_patching_stream(token: str, message_id: int, index: int, key: str):
    _, message = shared_message(token, message_id)
    try:
        model, patching_request, _ = shown_map(message, index, key)
    except NotFound as error:  # an ending stream, never an error: EventSource retries those for ever
        return finished_stream(render_template("chat/_patching_gone.html", message=error.description))
    return map_stream(message, model, patching_request, watch=True)


def shown_map(message: Message, index: int, key: str) -> tuple[str, PatchingRequest, str]:
    """(model, request, edited message) of the map named `key` here, when it is of token `index` of this
    reply (a name never opens another conversation's map); else 404."""
    named = patching_service().named(key)
    if named is None or named[1].index != index:
        abort(404, "No such map: the presenter's page names the maps it shows (it may have been forgotten since).")
    model, patching_request, corrupted = named
    try:
        clean = inside_service().request_for(message, service().details(message.id), index)
        writer = runnable_writer(message, "Patching cannot run on")
    except ChatError as error:
        abort(error.status, str(error))
    except InsideError as error:
        abort(error.status, str(error))
    if clean.context_ids != patching_request.clean_ids or model != writer:
        abort(404, "No such map for this reply.")
    return named


def current(job: AnyJob | None) -> Patching | None:
    return None if job is None else cast(Patching | None, job.result.patching)


@bp.get("/c/<conversation_id>/m/<int:message_id>/patching/<int:index>/stream")
def patching_stream(conversation_id: str, message_id: int, index: int):
    """The cells of the running job as they arrive, each batch one fragment of out-of-band cells, then the
    whole finished section (`done`)."""
    message = owned_message(conversation_id, message_id)
    corrupted, against = form_values()
    try:
        model, patching_request = checked(message, index, corrupted, against)
    except InsideError as error:  # an ending stream, never an error: EventSource retries those for ever
        return finished_stream(render_template("chat/_patching_gone.html", message=str(error)))
    return map_stream(message, model, patching_request)


def map_stream(message: Message, model: str, patching_request: PatchingRequest, watch: bool = False):
    """A map's job streamed as its page shows it; `watch`: read-only (a follower's, a share link's), which
    neither keeps the job alive nor stops it by leaving."""
    job = patching_service().job(model, patching_request)
    tokenizer = service().writer(message).tokenizer
    config = service().writer(message).model.config
    if job is None:
        kept = patching_service().report(model, patching_request)
        return finished_stream(render_template(
            "chat/_patching_maps.html", view=patching_view.maps_view(tokenizer, patching_request, kept, None, config),
            job=None, stream_url=None, stop_url=None))

    def render(event) -> str | None:
        if event.name == "cells" and isinstance(event.data, Cells):
            so_far = current(job)
            estimate = so_far.estimate if so_far is not None else None
            cells = patching_view.cell_views(event.data, first_difference(patching_request.clean_ids,
                                                                          patching_request.corrupted_ids) or 0,
                                             estimate)
            return render_template("chat/_patching_cells.html", cells=cells) if cells else None
        if event.name == "estimate" and isinstance(event.data, Patching):
            return render_template("chat/_patching_cells.html", cells=patching_view.estimate_views(event.data))
        if event.name == "metrics" and isinstance(event.data, PatchingMetrics):
            return render_template("chat/_patching_values.html", values=event.data, oob=True)
        return None

    def final(job: AnyJob) -> str:
        view = patching_view.maps_view(tokenizer, patching_request, current(job), job, config)
        return render_template("chat/_patching_maps.html", view=view, job=job, stream_url=None, stop_url=None)

    return stream_job(job, render, final, watch=watch, follower=bool(g.get("follower")))


@bp.post("/c/<conversation_id>/m/<int:message_id>/patching/<int:index>/stop/<job_id>")
def patching_stop(conversation_id: str, message_id: int, index: int, job_id: str):
    """Stop: this browser no longer follows the job (the cells it worked out stay on its page), which is cancelled
    unless another browser asked for the same map; then back to the page."""
    message = owned_message(conversation_id, message_id)
    job = glassbox().core.get(job_id)
    back: dict[str, Any] = {"conversation_id": conversation_id, "message_id": message_id, "index": index}
    left = False  # another browser still wants the map: it goes on, and only this page stops following it
    if job is not None and job.asked_by(owner_id()) and isinstance(job.request, PatchingRequest):
        if job.withdraw(owner_id()):
            job.cancel()
        else:
            left = True
            job.keep_running()  # this page's stream leaving must not cancel the other browser's map
        back.update(corrupted=request.form.get("corrupted", ""), against=job.request.against, stopped=1)
    if not request.headers.get("HX-Request"):
        return redirect(url_for("chat.patching", **back), 303)
    if not left:
        return "", 204  # the stream ends with the stopped map
    assert job is not None
    loaded = service().writer(message)
    view = patching_view.maps_view(loaded.tokenizer, job.request, current(job), job, loaded.model.config, left=True)
    return (render_template("chat/_patching_maps.html", view=view, job=job, stream_url=None, stop_url=None),
            {"HX-Retarget": "#patching-maps", "HX-Reswap": "outerHTML"})
