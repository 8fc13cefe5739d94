"""One head over a whole reply: its attention as query positions × key positions, labelled with the real
tokens and the prompt's regions, as a page reached from the Inside page's chosen head (no JavaScript
needed: the request waits for its job, as Inside's does) and as JSON (docs/api.md). The owner's, and
read-only through a share link; Inside's 404s and 409s for the same message, 400 for a head that is not
"layer.head" (or rows that are not "reply" or "user"), 404 for a head the model does not have."""

from __future__ import annotations

from flask import Response, abort, jsonify, render_template, request

from webapp.chat.heads import view as head_view
from webapp.chat.heads.jobs import HeadReport
from webapp.chat.heads.service import MAX_ROWS, HeadService, Region, regions
from webapp.chat.heads.view import BadHead
from webapp.chat.inside.waiting import InsideError, report_or_wait, runnable_writer
from webapp.chat.records import Conversation, Message
from webapp.chat.service import ChatError
from webapp.chat.web.blueprint import bp, owned_conversation, owned_message, service
from webapp.chat.web.presenter_view import show_followers
from webapp.chat.web.share import shared_message
from webapp.chat.web.token_views import token_text, whitespace_name
from webapp.web import heavy
from webapp.web.state import glassbox


def head_service() -> HeadService:
    return glassbox().service(HeadService)


@bp.get("/c/<conversation_id>/m/<int:message_id>/inside/<int:index>/head/<name>")
def head(conversation_id: str, message_id: int, index: int, name: str):
    """Layer L, head H (`name` "L.H") over the reply up to token `index`; ?keys=all: every key position;
    ?rows=user: query rows from the user's message on (the reply's start marker by default)."""
    conversation = owned_conversation(conversation_id)
    page = head_page(conversation, owned_message(conversation_id, message_id), index, name)
    return show_followers(page, conversation_id, message_id, f"inside/{index}/head/{name}",
                          f"layer {name.split('.')[0]}, head {name.split('.')[-1]} at token {index + 1}",
                          keep=("keys", "rows"))


@bp.get("/c/<conversation_id>/m/<int:message_id>/inside/<int:index>/head/<name>.json")
def head_json(conversation_id: str, message_id: int, index: int, name: str):
    heavy.admit()
    return head_answer(owned_message(conversation_id, message_id), index, name)


@bp.get("/shared/<token>/m/<int:message_id>/inside/<int:index>/head/<name>")
def shared_head(token: str, message_id: int, index: int, name: str):
    conversation, message = shared_message(token, message_id)
    return head_page(conversation, message, index, name, shared=token)


@bp.get("/shared/<token>/m/<int:message_id>/inside/<int:index>/head/<name>.json")
def shared_head_json(token: str, message_id: int, index: int, name: str):
    heavy.admit()
    return head_answer(shared_message(token, message_id)[1], index, name)


def head_answer(message: Message, index: int, name: str) -> Response | tuple:
    try:
        report, found = resolve(message, index, name)
    except BadHead as error:
        return jsonify({"error": str(error)}), 400
    except InsideError as error:
        return jsonify({"error": str(error)}), error.status, error.headers
    return heavy.answer(heavy.Encoded.json(head_view.as_json(report, found)))


def head_page(conversation: Conversation, message: Message, index: int, name: str, shared: str | None = None):
    heavy.admit()  # as Inside's page: read as often as the JSON, and as costly to render
    odds = service().details(message.id).odds or []
    common = {"conversation": conversation, "message": message, "index": index, "count": len(odds),
              "shared": shared, "name": name}
    try:
        report, found = resolve(message, index, name)
    except BadHead as error:
        abort(400, str(error))
    except InsideError as error:
        if error.status != 409:
            abort(error.status, str(error))
        return render_template("chat/head.html", problem=str(error), **common), 409
    tokenizer = service().writer(message).tokenizer  # resolve() checked that it runs here
    expand = request.args.get("keys") == "all"
    n_layer, n_head = head_service().heads(runnable_writer(message))
    text = token_text(tokenizer, odds[index][0])[0]
    layer, number = report.request.layer, report.request.head
    rows = head_view.parse_rows(request.args.get("rows"))  # resolve() checked it
    page = render_template(
        "chat/head.html", problem=None, report=report, matrix=head_view.matrix(tokenizer, report, found, expand),
        expand=expand, rows=rows, layer=layer, head=number, token_text=text, token_name=whitespace_name(text),
        positions=len(report.request.context_ids), max_rows=MAX_ROWS,
        previous=neighbour(layer, number, -1, n_layer, n_head), following=neighbour(layer, number, 1, n_layer, n_head),
        **common)
    heavy.took(len(page))
    return page


def neighbour(layer: int, head: int, step: int, n_layer: int, n_head: int) -> str | None:
    """The head before or after L.H, reading block by block ("L.H"; None past the first or last)."""
    n = layer * n_head + head + step
    return f"{n // n_head}.{n % n_head}" if 0 <= n < n_layer * n_head else None


def resolve(message: Message, index: int, name: str) -> tuple[HeadReport, list[Region]]:
    """The report for head `name` over token `index`'s context (rows as ?rows= says), kept or worked out now
    by a job this request waits for, and the context's regions. Raises BadHead (400), InsideError: 404 (no
    such token or head), 409 (cannot run here, not finished), 429/503 (refused, still running), 500 (the job
    failed)."""
    layer, number = head_view.parse_head(name)
    rows = head_view.parse_rows(request.args.get("rows"))
    heads = head_service()
    model = runnable_writer(message)
    details = service().details(message.id)
    try:
        wanted = heads.request_for(model, message, details, index, layer, number, rows)
    except ChatError as error:
        raise InsideError(str(error), error.status) from None
    found = regions(details.prompt, index, len(wanted.context_ids))
    return report_or_wait(heads, model, wanted, "work this head's attention out"), found
