"""Inside this token: the logit lens and every head's attention at the position that produced a token of a
reply, as a page (no JavaScript needed: the request waits for its job, holding a stream slot) and as JSON
(docs/api.md). The owner's, and read-only through a share link."""

from __future__ import annotations

from flask import Response, abort, get_template_attribute, jsonify, render_template, request

from webapp.chat.decode.odds import TokenOdds
from webapp.chat.inside import view as inside_view
from webapp.chat.inside.jobs import InsideReport
from webapp.chat.inside.view import HeadView, LensRowView
from webapp.chat.inside.waiting import InsideError, inside_service, report_or_wait, runnable_writer
from webapp.chat.records import Conversation, Message
from webapp.chat.service import ChatError
from webapp.chat.web.blueprint import bp, owned_conversation, owned_message, service
from webapp.chat.web.presenter_view import show_followers
from webapp.chat.web.share import shared_message
from webapp.chat.web.token_views import token_text, whitespace_name
from webapp.web import heavy


@bp.get("/c/<conversation_id>/m/<int:message_id>/inside/<int:index>")
def inside(conversation_id: str, message_id: int, index: int):
    """The Inside page of token `index` (0-based) of a reply; ?head=L.H picks a head to list."""
    conversation = owned_conversation(conversation_id)
    page = inside_page(conversation, owned_message(conversation_id, message_id), index)
    return show_followers(page, conversation_id, message_id, f"inside/{index}", f"Inside token {index + 1}",
                          keep=("head",))


@bp.get("/c/<conversation_id>/m/<int:message_id>/inside/<int:index>.json")
def inside_json(conversation_id: str, message_id: int, index: int):
    heavy.admit()  # before any lookup: a refusal costs next to nothing (its error is JSON: pages.http_error)
    return inside_answer(owned_message(conversation_id, message_id), index)


@bp.get("/shared/<token>/m/<int:message_id>/inside/<int:index>")
def shared_inside(token: str, message_id: int, index: int):
    conversation, message = shared_message(token, message_id)
    return inside_page(conversation, message, index, shared=token)


@bp.get("/shared/<token>/m/<int:message_id>/inside/<int:index>.json")
def shared_inside_json(token: str, message_id: int, index: int):
    heavy.admit()
    return inside_answer(shared_message(token, message_id)[1], index)


def inside_answer(message: Message, index: int) -> Response | tuple:
    """The report's JSON, made once per kept report and kept as bytes (webapp/web/heavy.py)."""
    try:
        model, report = resolved(message, index)
    except InsideError as error:
        return jsonify({"error": str(error)}), error.status, error.headers
    tokenizer = service().writer(message).tokenizer
    encoded = inside_service().made_of(model, report.request, "json",
                                       lambda: heavy.Encoded.json(inside_view.as_json(tokenizer, report)))
    return heavy.answer(encoded)


def inside_page(conversation: Conversation, message: Message, index: int, shared: str | None = None):
    heavy.admit()  # the page is read as often as the JSON, and costs as much to render: counted the same
    details = service().details(message.id)
    odds = details.odds or []
    common = {"conversation": conversation, "message": message, "index": index, "count": len(odds),
              "shared": shared}
    try:
        model, report = resolved(message, index)
    except InsideError as error:
        if error.status != 409:
            abort(error.status, str(error))
        return render_template("chat/inside.html", problem=str(error), **common), 409
    tokenizer = service().writer(message).tokenizer  # resolve() checked that it runs here
    lens, heads = inside_service().made_of(model, report.request, "page", lambda: page_parts(tokenizer, report))
    n_layer, n_head, positions = report.attention.shape
    chosen_head = inside_view.parse_head(request.args.get("head"), n_layer, n_head)
    prompt_length = positions - min(index, positions)
    panel = TokenOdds.from_row(odds[index])
    text = token_text(tokenizer, report.request.token)[0]
    branched_at = (message.settings or {}).get("branched_at")
    page = render_template(
        "chat/inside.html", problem=None, report=report, token_text=text, token_name=whitespace_name(text),
        lens=lens, settled=report.settled_layer, heads=heads, chosen_head=chosen_head, panel=panel,
        attended=(inside_view.attended(tokenizer, report, *chosen_head, prompt_length) if chosen_head else []),
        positions=positions, n_layer=n_layer, n_head=n_head, origin=token_origin(panel, index, branched_at),
        branched_at=branched_at, **common)
    heavy.took(len(page))
    return page


def token_origin(panel: TokenOdds, index: int, branched_at: int | None) -> str:
    """Who put the token there: "typed" (a person, into a branch), "picked" (a person chose it from the
    model's alternatives), "kept" (sampled in the version this one was branched from), or "sampled"."""
    if panel.typed:
        return "typed"
    if branched_at is not None and index == branched_at:
        return "picked"
    if branched_at is not None and index < branched_at:
        return "kept"
    return "sampled"


def page_parts(tokenizer, report: InsideReport) -> tuple[list[LensRowView], list[list[HeadView]]]:
    """The page's heavy parts, made once per kept report: the lens rows, and every head's strip with its
    cells as HTML (the macro's, rendered here once rather than cell by cell on every request)."""
    cells = get_template_attribute("chat/_inside_cells.html", "cells")
    heads = inside_view.head_views(report)
    for layer in heads:
        for head in layer:
            head.cells = cells(head.strip)
    return inside_view.lens_view(tokenizer, report), heads


def resolve(message: Message, index: int) -> InsideReport:
    """The report for token `index` of a reply: kept, or worked out now by a job this request waits for.
    Raises InsideError: 404 (no such token), 409 (cannot run here, or the reply is not finished),
    429/503 (refused: limits, a full queue, no stream slot free), 500 (the job failed)."""
    return resolved(message, index)[1]


def resolved(message: Message, index: int) -> tuple[str, InsideReport]:
    """(the model that wrote the reply, the report), as resolve()."""
    inside = inside_service()
    model = runnable_writer(message)
    try:
        inside_request = inside.request_for(message, service().details(message.id), index)
    except ChatError as error:
        raise InsideError(str(error), error.status) from None
    return model, report_or_wait(inside, model, inside_request, "look inside this token")
