"""Who pushed this token: direct logit attribution of a reply's token, as a page (no JavaScript needed: the
request waits for its job, holding a stream slot, as the Inside page does) and as JSON (docs/api.md). The
owner's, and read-only through a share link; the same 404s and 409s as Inside for the same message, and
400 for an `against` that is no token."""

from __future__ import annotations

from flask import Response, abort, jsonify, render_template, request

from webapp.chat.attribution import view as attribution_view
from webapp.chat.attribution.jobs import AttributionReport
from webapp.chat.attribution.service import AttributionService
from webapp.chat.attribution.view import BadAgainst
from webapp.chat.inside.waiting import InsideError, report_or_wait, runnable_writer
from webapp.chat.records import Conversation, Message
from webapp.chat.service import ChatError
from webapp.chat.web.blueprint import bp, owned_conversation, owned_message, service
from webapp.chat.web.presenter_view import show_followers
from webapp.chat.web.share import shared_message
from webapp.chat.web.token_views import token_text, token_views, whitespace_name
from webapp.web.state import glassbox


def attribution_service() -> AttributionService:
    return glassbox().service(AttributionService)


@bp.get("/c/<conversation_id>/m/<int:message_id>/attribution/<int:index>")
def attribution(conversation_id: str, message_id: int, index: int):
    """Token `index` (0-based) of a reply, its logit split by part; ?against=<token id> for a difference."""
    conversation = owned_conversation(conversation_id)
    page = attribution_page(conversation, owned_message(conversation_id, message_id), index)
    return show_followers(page, conversation_id, message_id, f"attribution/{index}",
                          f"who pushed token {index + 1}", keep=("against",))


@bp.get("/c/<conversation_id>/m/<int:message_id>/attribution/<int:index>.json")
def attribution_json(conversation_id: str, message_id: int, index: int):
    return attribution_answer(owned_message(conversation_id, message_id), index)  # errors as JSON: http_error


@bp.get("/shared/<token>/m/<int:message_id>/attribution/<int:index>")
def shared_attribution(token: str, message_id: int, index: int):
    conversation, message = shared_message(token, message_id)
    return attribution_page(conversation, message, index, shared=token)


@bp.get("/shared/<token>/m/<int:message_id>/attribution/<int:index>.json")
def shared_attribution_json(token: str, message_id: int, index: int):
    return attribution_answer(shared_message(token, message_id)[1], index)


def attribution_answer(message: Message, index: int) -> Response | tuple:
    try:
        report = resolve(message, index, attribution_view.parse_against(request.args.get("against")))
    except BadAgainst as error:
        return jsonify({"error": str(error)}), 400
    except InsideError as error:
        return jsonify({"error": str(error)}), error.status, error.headers
    return jsonify(attribution_view.as_json(service().writer(message).tokenizer, report))


def attribution_page(conversation: Conversation, message: Message, index: int, shared: str | None = None):
    odds = service().details(message.id).odds or []
    common = {"conversation": conversation, "message": message, "index": index, "count": len(odds),
              "shared": shared}
    try:
        against = attribution_view.parse_against(request.args.get("against"))
        report = resolve(message, index, against)
    except BadAgainst as error:
        abort(400, str(error))
    except InsideError as error:
        if error.status != 409:
            abort(error.status, str(error))
        return render_template("chat/attribution.html", problem=str(error), **common), 409
    tokenizer = service().writer(message).tokenizer  # resolve() checked that it runs here
    embed, rows, biases = attribution_view.parts(report)
    text = token_text(tokenizer, report.request.token)[0]
    return render_template(
        "chat/attribution.html", problem=None, report=report, attribution=report.attribution,
        token_text=text, token_name=whitespace_name(text),
        against_text=None if against is None else token_text(tokenizer, against)[0],
        embed=embed, rows=rows, biases=biases, largest=attribution_view.largest(embed, rows, biases),
        scales=attribution_view.scale_of(report), steps=attribution_view.STEPS,
        alternatives=[alt for alt in token_views(tokenizer, [odds[index]])[0].alternatives if not alt.chosen],
        **common)


def resolve(message: Message, index: int, against: int | None) -> AttributionReport:
    """The report for token `index` of a reply: kept, or worked out now by a job this request waits for.
    Raises InsideError: 400 (`against` no token), 404 (no such token), 409 (cannot run here, or the reply
    is not finished), 429/503 (refused, or still running), 500 (the job failed)."""
    attributions = attribution_service()
    model = runnable_writer(message)
    try:
        wanted = attributions.request_for(model, message, service().details(message.id), index, against)
    except ChatError as error:
        raise InsideError(str(error), error.status) from None
    return report_or_wait(attributions, model, wanted, "split this token's logit")
