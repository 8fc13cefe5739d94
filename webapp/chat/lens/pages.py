"""The logit lens over a whole reply: every layer's most likely token at every position that produced a reply
token, as a page (no JavaScript needed: the request waits for its job, holding a stream slot, as the Inside
page does) and as JSON (docs/api.md). The owner's, and read-only through a share link; the same 404s and
409s as Inside for the same message."""

from __future__ import annotations

from flask import Response, abort, get_template_attribute, jsonify, render_template, request

from webapp.chat.inside.waiting import InsideError, report_or_wait, runnable_writer
from webapp.chat.lens import view as lens_view
from webapp.chat.lens.jobs import LensReport
from webapp.chat.lens.service import MAX_COLUMNS, LensService
from webapp.chat.records import Conversation, Message
from webapp.chat.service import ChatError
from webapp.chat.web.blueprint import bp, owned_conversation, owned_message, service
from webapp.chat.web.presenter_view import show_followers
from webapp.chat.web.share import shared_message
from webapp.web import heavy
from webapp.web.state import glassbox


def lens_service() -> LensService:
    return glassbox().service(LensService)


@bp.get("/c/<conversation_id>/m/<int:message_id>/lens")
def lens(conversation_id: str, message_id: int):
    """The whole reply through the logit lens; ?shade=written shades cells by the written token's odds."""
    conversation = owned_conversation(conversation_id)
    page = lens_page(conversation, owned_message(conversation_id, message_id))
    return show_followers(page, conversation_id, message_id, "lens", "the reply through the logit lens",
                          keep=("shade",))


@bp.get("/c/<conversation_id>/m/<int:message_id>/lens.json")
def lens_json(conversation_id: str, message_id: int):
    heavy.admit()  # before any lookup: a refusal costs next to nothing (its error is JSON: pages.http_error)
    return lens_answer(owned_message(conversation_id, message_id))


@bp.get("/shared/<token>/m/<int:message_id>/lens")
def shared_lens(token: str, message_id: int):
    conversation, message = shared_message(token, message_id)
    return lens_page(conversation, message, shared=token)


@bp.get("/shared/<token>/m/<int:message_id>/lens.json")
def shared_lens_json(token: str, message_id: int):
    heavy.admit()
    return lens_answer(shared_message(token, message_id)[1])


def lens_answer(message: Message) -> Response | tuple:
    """The report's JSON, made once per kept report and kept as bytes (webapp/web/heavy.py)."""
    try:
        model, report = resolved(message)
    except InsideError as error:
        return jsonify({"error": str(error)}), error.status, error.headers
    tokenizer = service().writer(message).tokenizer
    odds = service().details(message.id).odds or []
    at, record = branched_at(message), message.intervention
    # the request fixes the numbers; the message adds who put each token there and its saved odds
    columns = lens_view.columns(tokenizer, report, odds, at)
    what = repr(("json", len(odds), record, [(c.origin, c.probability, c.rank) for c in columns]))
    encoded = lens_service().made_of(model, report.request, what, lambda: heavy.Encoded.json(
        lens_view.as_json(tokenizer, report, odds, at, len(odds), record)))
    return heavy.answer(encoded)


def lens_page(conversation: Conversation, message: Message, shared: str | None = None):
    heavy.admit()  # as the Inside page: read as often as the JSON, and as costly to render
    odds = service().details(message.id).odds or []
    shade_by = request.args.get("shade", "top")
    if shade_by not in lens_view.SHADE_BY:
        abort(400, "shade must be top or written.")
    common = {"conversation": conversation, "message": message, "count": len(odds), "shared": shared,
              "shade_by": shade_by}
    try:
        model, report = resolved(message)
    except InsideError as error:
        if error.status != 409:
            abort(error.status, str(error))
        return render_template("chat/lens.html", problem=str(error), **common), 409
    tokenizer = service().writer(message).tokenizer  # resolve() checked that it runs here
    body = lens_service().made_of(model, report.request, f"rows:{shade_by}", lambda: table_body(
        lens_view.grid_rows(tokenizer, report, shade_by)))
    page = render_template(
        "chat/lens.html", problem=None, report=report, body=body, max_columns=MAX_COLUMNS,
        columns=lens_view.columns(tokenizer, report, odds, branched_at(message)),
        n_layer=len(report.top) - 1, branched_at=branched_at(message), **common)
    heavy.took(len(page))
    return page


def table_body(rows: list[lens_view.LensGridRow]) -> str:
    """The grid's rows as HTML (templates/chat/_lens_rows.html), rendered once per kept report and shading:
    they hold no address, so a share link's page and the owner's use the same."""
    return get_template_attribute("chat/_lens_rows.html", "rows")(rows)


def branched_at(message: Message) -> int | None:
    return (message.settings or {}).get("branched_at")


def resolved(message: Message) -> tuple[str, LensReport]:
    """(the model that wrote the reply, the report): kept, or worked out now by a job this request waits for.
    Raises InsideError: 404 (no tokens), 409 (cannot run here, or the reply is not finished), 429/503
    (refused, or still running after GLASSBOX_INSIDE_WAIT_SECONDS), 500 (the job failed)."""
    lenses = lens_service()
    model = runnable_writer(message)
    try:
        wanted = lenses.request_for(model, message, service().details(message.id))
    except ChatError as error:
        raise InsideError(str(error), error.status) from None
    return model, report_or_wait(lenses, model, wanted, "read this reply through the lens")
