"""Switch parts off, and watch the reply change (webapp/chat/ablation/service.py): a reply run again with heads,
attention layers or MLPs zeroed or mean-ablated, as a new version (a form, and its JSON twin); and one
token's position with them switched off, its odds beside the original's (a page, a fragment, JSON).
The owner's only: it runs the model."""

from __future__ import annotations

from typing import cast

from flask import abort, jsonify, render_template, request

from webapp.chat import interventions
from webapp.chat.ablation.compute import intervention
from webapp.chat.ablation.jobs import AblationRequest, AblationResult, Odds
from webapp.chat.ablation.service import AblationService, config_of
from webapp.chat.inside.waiting import InsideError, wait_for_job
from webapp.chat.interventions import describe
from webapp.chat.records import Message
from webapp.chat.service import ChatError
from webapp.chat.web.blueprint import bp, owned_conversation, owned_message, owned_page, service
from webapp.chat.web.composer import start_reply, start_version_json
from webapp.chat.web.token_views import token_text
from webapp.web import is_htmx
from webapp.web.security import csrf_json_or_form, owner_id
from webapp.web.state import glassbox


def ablation_service() -> AblationService:
    return glassbox().service(AblationService)


@bp.app_template_filter("intervention_label")
def intervention_label(record: dict | None) -> str:
    """A version's label: what was switched off ("heads 1.0, 2.3 zeroed"), or added ("steered: ...")."""
    return interventions.label(record)


# -- a reply, ablated: a new version ----------------------------------------------------------------
@bp.post("/c/<conversation_id>/m/<int:message_id>/ablate")
def ablate(conversation_id: str, message_id: int):
    """heads=1.0,2.3 (layer.head, from 0), layers=1 (every head of it), mlps=1, mode=zero|mean: the reply run
    again from its exact prompt with its own settings and seed, those parts switched off in every forward.
    A new version of the reply; the old one stays."""
    page = owned_page(conversation_id)
    assert page.conversation is not None
    try:
        turn = ablated_turn(conversation_id, message_id, request.form, page)
    except ChatError as error:
        if error.status == 400 and is_htmx():  # the parts typed: said beside the fields, which keep them
            values = {name: request.form.get(name, "")[:400] for name in ("heads", "layers", "mlps", "mode")}
            return (render_template("chat/_ablate_refused.html", message=owned_message(conversation_id, message_id),
                                    conversation_id=conversation_id, values=values, error=str(error)), 400,
                    {"HX-Retarget": f"#ablate-{message_id}", "HX-Reswap": "outerHTML"})
        abort(error.status, str(error))
    return start_reply(turn, page, borrowed=True)


@bp.post("/c/<conversation_id>/m/<int:message_id>/ablate.json")
@csrf_json_or_form
def ablate_json(conversation_id: str, message_id: int):
    """The same, for scripts: fields as a JSON body (heads a list or a string) or a form ->
    {"message_id": the new version}. Its stream is /chat/c/<c>/m/<id>/stream, as every reply's."""
    fields = request.get_json(silent=True) if request.is_json else request.form
    if not isinstance(fields, dict) and request.is_json:
        return jsonify({"error": "Send a JSON object: heads, layers, mlps, mode."}), 400
    return start_version_json(lambda page: ablated_turn(conversation_id, message_id, fields or {}, page),
                              conversation_id)


def ablated_turn(conversation_id: str, message_id: int, fields, page):
    """The checked turn of an ablated version (its edit worked out first, for a mean ablation). Raises
    ChatError: 400 (bad parts), 404, 409 (cannot run here), 429/503 (refused), 500."""
    message = owned_message(conversation_id, message_id)
    ablation = ablation_service()
    name, loaded = ablation.writer(message)
    parts = ablation.parts(loaded, fields)
    assert page.conversation is not None
    run = ablation.reply_request(message, parts, page.messages)
    edit = ablation.zero_edit(loaded, parts) if parts.mode == "zero" else worked_out(name, run).edit
    assert edit is not None
    return ablation.reply_turn(page.conversation, message, page.messages, parts, edit)


def worked_out(model: str, run: AblationRequest) -> AblationResult:
    """The result of an ablation job: kept, or worked out now by a job this request waits for (wait_for_job: a
    bulk stream slot, as Inside). Raises ChatError: 429/503 (refused, too slow: the job goes on), 500 (failed)."""
    ablation = ablation_service()
    found = ablation.report(model, run)
    if found is not None:
        return found
    try:
        job = wait_for_job(lambda: ablation.start(owner_id(), model, run), "switch those parts off", "edit")
    except InsideError as error:
        raise AblationRefused(str(error), error.status, error.headers) from None
    return cast(AblationResult, job.result)


class AblationRefused(ChatError):
    """A job refused, too slow or failed: its status and headers (Retry-After)."""

    def __init__(self, message: str, status: int, headers: dict[str, str]) -> None:
        super().__init__(message, status)
        self.headers = headers


# -- one position, parts switched off ---------------------------------------------------------------
@bp.get("/c/<conversation_id>/m/<int:message_id>/tokens/<int:index>/ablated")
def ablated_position(conversation_id: str, message_id: int, index: int):
    """Token `index` (0-based) of a reply: the odds at its position with the parts switched off beside the
    original's; a page, or the token panel's fragment for htmx."""
    conversation = owned_conversation(conversation_id)
    message = owned_message(conversation_id, message_id)
    try:
        found = position(message, index)
    except ChatError as error:
        abort(error.status, str(error))
    tokenizer = service().writer(message).tokenizer
    context = {"conversation": conversation, "message": message, "index": index, "answer": found,
               "text_of": lambda t: token_text(tokenizer, t)[0]}
    if is_htmx():
        return render_template("chat/_ablated_odds.html", **context)
    return render_template("chat/ablated.html", **context)


@bp.get("/c/<conversation_id>/m/<int:message_id>/tokens/<int:index>/ablated.json")
def ablated_position_json(conversation_id: str, message_id: int, index: int):
    """{"token": {index, id, text}, "intervention": {...}, "original": odds, "ablated": odds}, each odds
    {"p": of the reply's token, "rank": its rank, "top": [{id, text, p}]} (docs/api.md)."""
    try:
        message = owned_message(conversation_id, message_id)
        found = position(message, index)
    except ChatError as error:
        return jsonify({"error": str(error)}), error.status, getattr(error, "headers", {})
    tokenizer = service().writer(message).tokenizer

    def odds(o: Odds) -> dict:
        return {"p": o.token_probability, "rank": o.token_rank,
                "top": [{"id": t, "text": token_text(tokenizer, t)[0], "p": p} for t, p in o.top]}

    token = found["request"].token
    return jsonify({"token": {"index": index, "id": token, "text": token_text(tokenizer, token)[0]},
                    "intervention": found["intervention"], "original": odds(found["result"].clean),
                    "ablated": odds(found["result"].edited)})


def position(message: Message, index: int) -> dict:
    """Parts from the query string switched off at token `index`'s position. Raises ChatError."""
    ablation = ablation_service()
    name, loaded = ablation.writer(message)
    parts = ablation.parts(loaded, request.args)
    run = ablation.position_request(message, service().details(message.id), index, parts)
    result = worked_out(name, run)
    record = intervention(parts, config_of(loaded).n_head)
    return {"request": run, "result": result, "intervention": record, "label": describe(record)}
