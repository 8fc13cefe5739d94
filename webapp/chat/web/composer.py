"""The composer and a reply's place on the page: the sampling settings a browser keeps, the window
arithmetic beside them, bad input given back with its messages, and starting a checked turn."""

from __future__ import annotations

from flask import current_app, redirect, render_template, request, session, url_for

from webapp.chat.decode.publish import chat_result
from webapp.chat.decode.types import SamplingParams
from webapp.chat.model.prompt import PromptTooLong
from webapp.chat.service import ChatError, Turn
from webapp.chat.web import token_views
from webapp.chat.web.blueprint import bp, service, settings
from webapp.chat.web.forms import FormError, FormErrors, remembered_sampling, submitted_sampling
from webapp.core import Job, Refused
from webapp.web import is_htmx, quotas, refusal_headers, refusal_status
from webapp.web.security import owner_id
from webapp.web.streams import held_slot


def sampling_limit() -> int:
    return service().max_new_tokens_limit()


def with_token_views(messages: list[dict]) -> list[dict]:
    """The replies their owner reads as tokens get their tokens (and odds) to show."""
    for m in messages:
        if m.get("token_view") and m["role"] == "assistant" and m["status"] != "pending":
            try:
                tokenizer = service().writer(m).tokenizer
            except ChatError:  # its model is not run here: shown as text, which needs no tokenizer
                continue
            views, _ = token_views.readable_token_views(tokenizer, service().details(m["id"]))
            if views:
                m["token_views"] = views
    return messages


def render_page(conversation: dict | None, *, draft: str = "", errors: dict | None = None,
                sampling: SamplingParams | None = None, status: int = 200, typed: dict | None = None,
                beside: int | None = None):
    svc = service()
    messages = with_token_views(svc.history(conversation["id"])) if conversation else []
    body = render_template("chat/page.html", conversation=conversation, messages=messages,
                           conversations=svc.conversations(owner_id()), draft=draft,
                           errors=errors or {}, sampling=sampling or default_sampling(),
                           max_new_tokens_limit=sampling_limit(), typed=typed or {},
                           beside=beside_reply(messages, beside), chosen_model=typed and typed.get("model"))
    return body, status


def beside_reply(messages: list[dict], beside: int | None) -> dict | None:
    """The other version of the last reply to show beside it (two models asked at once), when `beside`
    names one; anything else is no pair."""
    if beside is None or not messages or messages[-1]["role"] != "assistant":
        return None
    last = messages[-1]
    if beside == last["id"] or beside not in (last.get("versions") or []):
        return None
    other = service().message(last["conversation_id"], beside)
    return with_token_views([other])[0] if other else None


def default_sampling() -> SamplingParams:
    """This browser's last settings (kept in its session by a reply they started), else the defaults."""
    limit = sampling_limit()
    return (remembered_sampling(session.get("sampling"), default_max_new_tokens=settings().max_new_tokens,
                                max_new_tokens_limit=limit)
            or SamplingParams(max_new_tokens=min(settings().max_new_tokens, limit)))


@bp.context_processor
def composer_context():
    return {"token_budget": token_budget}


def token_budget(conversation: dict | None, max_new_tokens) -> dict:
    """The window arithmetic the composer explains beside Max new tokens (webapp/chat/model/prompt.py)."""
    prompts = service().prompts
    fixed = prompts.block_size - prompts.budget(0)  # examples and markers, whatever the reply asks
    history = service().history(conversation["id"]) if conversation else []
    used = sum(len(prompts.encode_turn(m["role"], m["content"])) for m in history
               if m["role"] == "user" or m["status"] in ("complete", "stopped"))
    asked = max_new_tokens if isinstance(max_new_tokens, int) else None
    examples = len(prompts.fewshot_ids)
    return {"window": prompts.block_size, "examples": examples, "markers": fixed - examples,
            "room": prompts.block_size - fixed, "conversation": used, "asked": asked,
            "left": None if asked is None else prompts.block_size - fixed - asked}


def composer_error(conversation, draft, error: FormError | str, sampling=None, status=400, field="content",
                   headers: dict | None = None):
    """Bad input: say what is wrong beside each field and give everything typed back, nothing saved."""
    errors = error.errors if isinstance(error, FormError) else {field: error}
    typed = submitted_sampling(request.form)
    typed.update({name: request.form.get(name, "")[:100] for name in ("model", "also_model")})
    if is_htmx():
        html = render_template("chat/_composer.html", conversation=conversation, draft=draft, errors=errors,
                               sampling=sampling or default_sampling(), max_new_tokens_limit=sampling_limit(),
                               typed=typed)
        return html, status, {"HX-Retarget": "#composer", "HX-Reswap": "outerHTML", **(headers or {})}
    body, status = render_page(conversation, draft=draft, errors=errors, sampling=sampling, status=status,
                               typed=typed)
    return body, status, headers or {}


def too_long(error: PromptTooLong) -> FormErrors:
    """A message too long for the window: said beside the message and beside Max new tokens, the
    other way to make it fit (the composer opens its Sampling panel for it)."""
    most = service().prompts.budget(0) - error.turn_tokens  # the window less examples, markers, message
    tokens = (f"With this message ({error.turn_tokens:,} tokens) at most {most:,} new tokens fit."
              if most >= 1 else f"This message ({error.turn_tokens:,} tokens) leaves no room for a reply: "
              "shorten it.")
    return FormErrors({"content": str(error), "max_new_tokens": tokens})


def start_reply(turn: Turn, draft: str = "", second: Turn | None = None):
    """Save and queue a checked turn (ChatService.start; with `second`, another model's reply to the same
    question beside it); answer htmx with the conversation, a form (no JavaScript: it waits for the whole
    reply, holding a stream slot) with the page."""
    owner = owner_id()
    quotas.check_chat(service().store, owner, new_conversation=turn.conversation is None)  # the browser's quotas (403)
    beside, notice = None, None
    try:
        with held_slot(not is_htmx()) as slot:  # no JavaScript: the form waits for the whole reply
            if second is None:
                conversation, reply_id, created = service().start(owner, turn)
            else:
                conversation, first, other, created = service().start_both(owner, turn, second)
                if isinstance(other, int):
                    reply_id, beside = other, first
                else:  # the second model was refused: the first answers alone, and the page says why
                    reply_id, notice = first, other
    except Refused as error:  # the service took back what it saved for it
        return composer_error(turn.conversation, draft, str(error), turn.sampling, refusal_status(error),
                              headers=refusal_headers(error))
    except ChatError as error:  # the conversation is at its limit of messages: nothing was saved
        return composer_error(turn.conversation, draft, str(error), turn.sampling, error.status)
    session["sampling"] = turn.sampling.as_dict()  # this browser's settings, until it resets them
    if slot is None:
        return reply_fragment(conversation, created, turn.sampling, beside=beside, notice=notice)
    with slot:
        for waited in (reply_id, beside):
            if waited is not None:
                wait_for_reply(waited)
    return redirect(url_for("chat.conversation", conversation_id=conversation["id"], beside=beside), 303)


def reply_fragment(conversation, created, sampling, beside: int | None = None, notice: str | None = None):
    svc = service()
    messages = with_token_views(svc.history(conversation["id"]))
    response = current_app.make_response(render_template(
        "chat/_conversation_swap.html", conversation=conversation,
        # the replies read as tokens stay so (‹ › switching versions once showed them as text until a reload)
        messages=messages, conversations=svc.conversations(owner_id()), beside=beside_reply(messages, beside),
        notice=notice, sampling=sampling, max_new_tokens_limit=sampling_limit(), draft="", errors={}))
    if created or beside is not None:  # the address shows the pair too, so a reload keeps it
        response.headers["HX-Push-Url"] = url_for("chat.conversation", conversation_id=conversation["id"],
                                                  beside=beside)
    return response


def wait_for_reply(message_id: int) -> None:
    """Without JavaScript the form waits for the whole reply, then shows the page."""
    job = service().job_for(message_id)
    events = (job.subscribe(settings().heartbeat_seconds) if job is not None
              else service().follow(message_id, settings().heartbeat_seconds))  # another front end runs it
    for _ in events:
        pass


def render_message(conversation_id: str, message_id: int, job: Job | None = None) -> str:
    messages = service().history(conversation_id)
    message = next((m for m in messages if m["id"] == message_id), None)
    if message is None:  # a version beside the branch shown (two models asked at once), or gone
        message = service().message(conversation_id, message_id)
        if message is None:
            return ""
    if message["status"] == "pending" and job is not None and job.finished_state:
        # Its job ended but the reply could not be saved (disk full, read-only database): show the
        # job's own outcome, never a pending reply whose stream the browser would reopen for ever.
        message = {**message, "status": "error", "content": chat_result(job).reply,
                   "error": job.error or "The reply could not be saved."}
    return render_template("chat/_message_final.html", message_row=with_token_views([message])[0],
                           conversation_id=conversation_id, is_last=messages[-1]["id"] == message_id)


