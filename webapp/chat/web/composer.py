"""The composer and a reply's place on the page: the sampling settings a browser keeps, the window
arithmetic beside them, bad input given back with its messages, and starting a checked turn."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from flask import Response, current_app, jsonify, redirect, render_template, request, session, url_for

from webapp.chat.decode.publish import chat_result
from webapp.chat.decode.types import ChatJob, SamplingParams
from webapp.chat.model.prompt import PromptTooLong
from webapp.chat.records import ChatPage, Conversation, Message, Status
from webapp.chat.service import ChatError, Turn
from webapp.chat.web import token_views
from webapp.chat.web.blueprint import owned_page, service, settings
from webapp.chat.web.forms import FormError, FormErrors, remembered_sampling, submitted_sampling
from webapp.core import Refused
from webapp.web import follow, is_htmx, quotas, refusal_headers, refusal_status
from webapp.web.security import owner_id
from webapp.web.streams import held_slot


def sampling_limit() -> int:
    return service().max_new_tokens_limit()


def token_views_of(messages: Sequence[Message], *, chosen: bool = True) -> dict[int, list]:
    """The replies shown as their tokens, shaded by their odds, by id (their details read in one statement):
    those their owner chose to read so (`chosen`), else every finished reply with tokens (a shared page). A
    reply whose model is not run here has none: it is shown as text, which needs no tokenizer."""
    replies = [m for m in messages if m.is_reply and not m.pending and (m.token_view if chosen else m.tokens)]
    details = service().details_of([m.id for m in replies]) if replies else {}
    views = {}
    for m in replies:
        try:
            tokenizer = service().writer(m).tokenizer
        except ChatError:
            continue
        found, _ = token_views.readable_token_views(tokenizer, details[m.id])
        if found:
            views[m.id] = found
    return views


def render_page(page: ChatPage, *, draft: str = "", errors: dict | None = None,
                sampling: SamplingParams | None = None, status: int = 200, typed: dict | None = None,
                beside: int | None = None):
    """The chat page; `beside`: the version of the last reply shown beside it (two models asked at once)."""
    body = render_template("chat/page.html", **page_context(page, sampling or default_sampling(), draft=draft,
                                                            errors=errors, typed=typed, beside=beside))
    return body, status


def beside_reply(page: ChatPage | None, beside: int | None) -> Message | None:
    """The other version of the last reply to show beside it, when `beside` names one (from the page's
    tree, read with it); anything else is no pair."""
    messages = page.messages if page else []
    if beside is None or not messages or messages[-1].role != "assistant":
        return None
    last = messages[-1]
    if beside == last.id or beside not in (last.versions or []):
        return None
    assert page is not None
    return page.tree[beside]


def page_context(page: ChatPage | None, sampling: SamplingParams, *, draft: str = "", errors: dict | None = None,
                 typed: dict | None = None, beside: int | None = None, **more) -> dict:
    """What the chat templates render, all of it from the page read once (ChatStore.page): the templates
    read nothing themselves. `page` None: the composer of a new chat."""
    messages = page.messages if page else []
    conversation = page.conversation if page else None
    model = service().conversation_model(conversation) if conversation else None
    paired = beside_reply(page, beside)
    return {"conversation": conversation, "messages": messages,
            "token_views": token_views_of(messages + ([paired] if paired else [])),
            "conversations": page.conversations if page else [], "share_token": page.share_token if page else None,
            "draft": draft, "errors": errors or {}, "sampling": sampling, "typed": typed or {},
            "max_new_tokens_limit": sampling_limit(),
            "budget": token_budget(messages, sampling.max_new_tokens, model),
            "model": model, "model_gone": service().model_gone(conversation),
            "beside": paired,
            **presenting(conversation), **more}


def presenting(conversation: Conversation | None) -> dict:
    """The conversation's follow link while its owner presents it (webapp/chat/web/present.py), and the
    presenting session's, which then shows this conversation (webapp/web/follow.py)."""
    if conversation is None or conversation.owner != owner_id():
        return {"present_token": None, "present_session": None}
    token, session = follow.presented_here("chat", conversation.id)
    return {"present_token": token, "present_session": session}


def default_sampling() -> SamplingParams:
    """This browser's last settings (kept in its session by a reply they started), else the defaults."""
    limit = sampling_limit()
    return (remembered_sampling(session.get("sampling"), default_max_new_tokens=settings().max_new_tokens,
                                max_new_tokens_limit=limit)
            or SamplingParams(max_new_tokens=min(settings().max_new_tokens, limit)))


def token_budget(history: list[Message], max_new_tokens, model: str | None = None) -> dict:
    """The window arithmetic the composer explains beside Max new tokens (webapp/chat/model/prompt.py),
    for a conversation whose branch shown is `history` ([]: a new chat), on `model` (None: the default)."""
    prompts = service().models.get(model).prompt
    fixed = prompts.block_size - prompts.budget(0)  # examples and markers, whatever the reply asks
    used = sum(len(prompts.encode_turn(m.role, m.content)) for m in history if m.said)
    asked = max_new_tokens if isinstance(max_new_tokens, int) else None
    examples = len(prompts.fewshot_ids)
    return {"window": prompts.block_size, "examples": examples, "markers": fixed - examples,
            "room": prompts.block_size - fixed, "conversation": used, "asked": asked,
            "left": None if asked is None else prompts.block_size - fixed - asked}


def composer_error(page: ChatPage, draft, error: FormError | str, sampling=None, status=400, field="content",
                   headers: dict | None = None):
    """Bad input: say what is wrong beside each field and give everything typed back, nothing saved."""
    errors = error.errors if isinstance(error, FormError) else {field: error}
    typed = submitted_sampling(request.form)
    typed.update({name: request.form.get(name, "")[:100] for name in ("model", "also_model")})
    if is_htmx():
        html = render_template("chat/_composer.html", **page_context(page, sampling or default_sampling(),
                                                                     draft=draft, errors=errors, typed=typed))
        return html, status, {"HX-Retarget": "#composer", "HX-Reswap": "outerHTML", **(headers or {})}
    body, status = render_page(page, draft=draft, errors=errors, sampling=sampling, status=status, typed=typed)
    return body, status, headers or {}


def too_long(error: PromptTooLong) -> FormErrors:
    """A message too long for the window: said beside the message and beside Max new tokens, the
    other way to make it fit (the composer opens its Sampling panel for it)."""
    most = service().prompts.budget(0) - error.turn_tokens  # the window less examples, markers, message
    tokens = (f"With this message ({error.turn_tokens:,} tokens) at most {most:,} new tokens fit."
              if most >= 1 else f"This message ({error.turn_tokens:,} tokens) leaves no room for a reply: "
              "shorten it.")
    return FormErrors({"content": str(error), "max_new_tokens": tokens})


def start_reply(turn: Turn, page: ChatPage, draft: str = "", second: Turn | None = None,
                borrowed: bool = False):
    """Save and queue a checked turn (ChatService.start_turn; with `second`, another model's reply to the same
    question beside it) asked from `page` (what the browser was shown, read before the turn); answer htmx
    with the conversation, a form (no JavaScript: it waits for the whole reply, holding a stream slot) with
    the page. `borrowed`: the turn's settings are not the browser's own (a reply written again with its own
    settings and seed: a branch, parts switched off, steered; or an example sent at its own temperature): the
    composer keeps the browser's own settings, never those."""
    composer = default_sampling() if borrowed else turn.sampling
    owner = owner_id()
    quotas.check_chat(service().store, owner, new_conversation=turn.conversation is None)  # the browser's quotas (403)
    beside, notice = None, None
    try:
        with held_slot(not is_htmx()) as slot:  # no JavaScript: the form waits for the whole reply
            if second is None:
                ids = service().start_turn(owner, turn)
                replies = [ids.reply_id]
            else:
                ids, other = service().start_both(owner, turn, second)
                if isinstance(other, int):
                    beside, replies = ids.reply_id, [ids.reply_id, other]
                else:  # the second model was refused: the first answers alone, and the page says why
                    notice, replies = other, [ids.reply_id]
    except Refused as error:  # the service took back what it saved for it
        return composer_error(page, draft, str(error), composer, refusal_status(error),
                              headers=refusal_headers(error))
    except ChatError as error:  # the conversation is at its limit of messages: nothing was saved
        return composer_error(page, draft, str(error), composer, error.status)
    if not borrowed:
        session["sampling"] = turn.sampling.as_dict()  # this browser's settings, until it resets them
    if slot is None:
        # two replies were saved: the page is read again rather than put together from the first turn
        after = service().page_after(owner, page, ids) if second is None else service().page(owner, ids.conversation_id)
        assert after is not None  # saved by this owner
        return reply_fragment(after, ids.created, composer, beside=beside, notice=notice)
    with slot:
        for reply in replies:
            wait_for_reply(reply)
    return redirect(url_for("chat.conversation", conversation_id=ids.conversation_id, beside=beside), 303)


def start_version_json(make_turn: Callable[[ChatPage], Turn], conversation_id: str
                       ) -> Response | tuple[Response, int] | tuple[Response, int, dict]:
    """A JSON route's new version of a reply (ablated, steered): the page read once, the turn checked and
    started -> {"message_id"}, or {"error"} with the status (400, 404, 409, 429/503 refused)."""
    try:
        page = owned_page(conversation_id)
        turn = make_turn(page)
        owner = owner_id()
        quotas.check_chat(service().store, owner, new_conversation=False)
        ids = service().start_turn(owner, turn)
    except ChatError as error:
        return jsonify({"error": str(error)}), error.status
    except Refused as error:
        return jsonify({"error": str(error)}), refusal_status(error), refusal_headers(error)
    return jsonify({"message_id": ids.reply_id})


def reply_fragment(page: ChatPage, created: bool, sampling: SamplingParams, beside: int | None = None,
                   notice: str | None = None):
    response = current_app.make_response(render_template("chat/_conversation_swap.html",
                                                         **page_context(page, sampling, beside=beside, notice=notice)))
    if created or beside is not None:  # the address shows the pair too, so a reload keeps it
        assert page.conversation is not None
        response.headers["HX-Push-Url"] = url_for("chat.conversation", conversation_id=page.conversation.id,
                                                  beside=beside)
    return response


def wait_for_reply(message_id: int) -> None:
    """Without JavaScript the form waits for the whole reply, then shows the page."""
    job = service().job_for(message_id)
    events = (job.subscribe(settings().heartbeat_seconds) if job is not None
              else service().follow(message_id, settings().heartbeat_seconds))  # another front end runs it
    for _ in events:
        pass


def render_message(conversation_id: str, message_id: int, job: ChatJob | None = None) -> str:
    messages = service().history(conversation_id)
    message = next((m for m in messages if m.id == message_id), None)
    if message is None:  # a version beside the branch shown (two models asked at once), or gone
        message = service().message(conversation_id, message_id)
        if message is None:
            return ""
    if message.status == Status.PENDING and job is not None and job.finished_state:
        # Its job ended but the reply could not be saved (disk full, read-only database): show the
        # job's own outcome, never a pending reply whose stream the browser would reopen for ever.
        message = dataclasses.replace(message, status=Status.ERROR, content=chat_result(job).reply,
                                      error=job.error or "The reply could not be saved.")
    return render_template("chat/_message_final.html", message_row=message, token_views=token_views_of([message]),
                           conversation_id=conversation_id, is_last=bool(messages) and messages[-1].id == message_id)


