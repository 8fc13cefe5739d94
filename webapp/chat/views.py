"""Chat pages and streams.  Views parse and validate, call the service, render a template."""

from __future__ import annotations

import json

from flask import (Blueprint, Response, abort, current_app, redirect, render_template, request,
                   session, url_for)

from webapp.chat import glass
from webapp.chat.forms import (FormError, FormErrors, Sampling, parse_content, parse_message, parse_sampling,
                               remembered_sampling, submitted_sampling)
from webapp.chat.prompt import PromptTooLong
from webapp.chat.service import ChatError, ChatService, Turn
from webapp.chat.store import ChatStore
from webapp.core import Refused
from webapp.web import get_core, refusal_headers, refusal_status
from webapp.web import storage
from webapp.web.sse import finished_stream, stream_job
from webapp.web.streams import take_slot
from webapp.security import owner_id

bp = Blueprint("chat", __name__, url_prefix="/chat")


def service() -> ChatService:
    ext = current_app.extensions
    if "glassbox.chat" not in ext:
        ext["glassbox.chat"] = ChatService(get_core(), ChatStore(ext["glassbox.db"]))
    return ext["glassbox.chat"]


def settings():
    return current_app.config["GLASSBOX"]


def is_htmx() -> bool:
    return request.headers.get("HX-Request") == "true"


def owned_conversation(conversation_id: str) -> dict:
    conversation = service().conversation(owner_id(), conversation_id)
    if conversation is None:
        abort(404, "No such conversation.")
    return conversation


def owned_message(conversation_id: str, message_id: int) -> dict:
    owned_conversation(conversation_id)
    message = service().message(conversation_id, message_id)
    if message is None:
        abort(404, "No such message.")
    return message


def sampling_limit() -> int:
    return service().max_new_tokens_limit()


def with_token_views(messages: list[dict]) -> list[dict]:
    """The replies their owner reads as tokens get their tokens (and odds) to show."""
    for m in messages:
        if m.get("token_view") and m["role"] == "assistant" and m["status"] != "pending":
            odds = service().details(m["id"])["odds"]
            if odds:
                m["token_views"] = glass.token_views(service().model.tokenizer, odds)
    return messages


def render_page(conversation: dict | None, *, draft: str = "", errors: dict | None = None,
                sampling: Sampling | None = None, status: int = 200, typed: dict | None = None):
    svc = service()
    messages = with_token_views(svc.history(conversation["id"])) if conversation else []
    body = render_template("chat/page.html", conversation=conversation, messages=messages,
                           conversations=svc.conversations(owner_id()), draft=draft,
                           errors=errors or {}, sampling=sampling or default_sampling(),
                           max_new_tokens_limit=sampling_limit(), typed=typed or {})
    return body, status


def default_sampling() -> Sampling:
    """This browser's last settings (kept in its session by a reply they started), else the defaults."""
    limit = sampling_limit()
    return (remembered_sampling(session.get("sampling"), default_max_new_tokens=settings().max_new_tokens,
                                max_new_tokens_limit=limit)
            or Sampling(max_new_tokens=min(settings().max_new_tokens, limit)))


@bp.context_processor
def composer_context():
    return {"token_budget": token_budget}


def token_budget(conversation: dict | None, max_new_tokens) -> dict:
    """The window arithmetic the composer explains beside Max new tokens (webapp/chat/prompt.py)."""
    prompts = service().prompts
    fixed = prompts.block_size - prompts.budget(0)  # examples and markers, whatever the reply asks
    history = service().history(conversation["id"]) if conversation else []
    used = sum(len(prompts.encode_turn(m["role"], m["content"])) for m in history
               if m["role"] == "user" or m["status"] in ("complete", "stopped"))
    asked = max_new_tokens if isinstance(max_new_tokens, int) else None
    return {"window": prompts.block_size, "fixed": fixed, "room": prompts.block_size - fixed,
            "conversation": used, "asked": asked,
            "left": None if asked is None else prompts.block_size - fixed - asked}


def composer_error(conversation, draft, error: FormError | str, sampling=None, status=400, field="content",
                   headers: dict | None = None):
    """Bad input: say what is wrong beside each field and give everything typed back, nothing saved."""
    errors = error.errors if isinstance(error, FormError) else {field: error}
    typed = submitted_sampling(request.form)
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


@bp.post("/sampling/reset")
def reset_sampling():
    """Forget this browser's sampling settings; the draft stays."""
    session.pop("sampling", None)
    conversation_id = request.form.get("conversation_id", "")
    conversation = owned_conversation(conversation_id) if conversation_id else None
    if is_htmx():
        return render_template("chat/_composer.html", conversation=conversation, draft=request.form.get("content", ""),
                               errors={}, sampling=default_sampling(), max_new_tokens_limit=sampling_limit(),
                               typed={}, reset=True)
    target = (url_for("chat.conversation", conversation_id=conversation["id"]) if conversation
              else url_for("chat.index"))
    return redirect(target, 303)


# -- pages ------------------------------------------------------------------------------------
@bp.get("/")
def index():
    return render_page(None)


@bp.get("/c/<conversation_id>")
def conversation(conversation_id: str):
    return render_page(owned_conversation(conversation_id))


# -- sending and replying ---------------------------------------------------------------------
@bp.post("/send")
def send():
    svc, form = service(), request.form
    conversation_id = form.get("conversation_id", "")
    conversation = owned_conversation(conversation_id) if conversation_id else None
    draft = form.get("content", "")
    try:
        content, sampling = parse_message(form, settings().max_message_chars,
                                          default_max_new_tokens=settings().max_new_tokens,
                                          max_new_tokens_limit=sampling_limit())
    except FormError as error:  # every field's error at once
        return composer_error(conversation, draft, error)
    try:
        turn = svc.send_turn(conversation, content, sampling, settings().max_messages)
    except PromptTooLong as error:
        return composer_error(conversation, draft, too_long(error), sampling)
    except ChatError as error:
        return composer_error(conversation, draft, str(error), sampling, error.status)
    return start_reply(turn, draft=draft)


def start_reply(turn: Turn, draft: str = ""):
    """Save and queue a checked turn (ChatService.start); answer htmx with the conversation, a form (no
    JavaScript: it waits for the whole reply, holding a stream slot) with the page."""
    owner = owner_id()
    storage.check_chat(owner, new_conversation=turn.conversation is None)  # the browser's quotas (403)
    # The slot is taken before anything is saved, so that "no slot free" (503) leaves nothing behind.
    slot = None if is_htmx() else take_slot()
    try:
        try:
            conversation, reply_id, created = service().start(owner, turn)
        except Refused as error:  # the service took back what it saved for it
            return composer_error(turn.conversation, draft, str(error), turn.sampling, refusal_status(error),
                                  headers=refusal_headers(error))
        session["sampling"] = turn.sampling.as_dict()  # this browser's settings, until it resets them
        if slot is not None:
            wait_for_reply(reply_id)
            return redirect(url_for("chat.conversation", conversation_id=conversation["id"]), 303)
        return reply_fragment(conversation, created, turn.sampling)
    finally:
        if slot is not None:
            slot.release()


def reply_fragment(conversation, created, sampling):
    svc = service()
    response = current_app.make_response(render_template(
        "chat/_conversation_swap.html", conversation=conversation,
        messages=svc.history(conversation["id"]), conversations=svc.conversations(owner_id()),
        sampling=sampling, max_new_tokens_limit=sampling_limit(), draft="", errors={}))
    if created:
        response.headers["HX-Push-Url"] = url_for("chat.conversation", conversation_id=conversation["id"])
    return response


def wait_for_reply(message_id: int) -> None:
    """Without JavaScript the form waits for the whole reply, then shows the page."""
    job = service().job_for(message_id)
    if job is not None:
        for _ in job.subscribe(settings().heartbeat_seconds):
            pass


@bp.get("/c/<conversation_id>/m/<int:message_id>/stream")
def stream(conversation_id: str, message_id: int):
    message = owned_message(conversation_id, message_id)
    job = service().job_for(message_id)
    if job is None or message["status"] != "pending":
        return finished_stream(render_message(conversation_id, message_id))

    def render(event):
        if event.name == "token":
            odds = event.data.get("odds")
            return render_template("chat/_token.html", text=event.data["text"],
                                   shade=glass.shade(odds.probability) if odds else None, odds=odds)
        if event.name in ("position", "running"):
            return render_template("chat/_reply_status.html", event=event)
        return None

    return stream_job(job, render, lambda job: render_message(conversation_id, message_id, job))


def render_message(conversation_id: str, message_id: int, job=None) -> str:
    messages = service().history(conversation_id)
    message = next((m for m in messages if m["id"] == message_id), None)
    if message is None:
        return ""
    if message["status"] == "pending" and job is not None and job.finished_state:
        # Its job ended but the reply could not be saved (disk full, read-only database): show the
        # job's own outcome, never a pending reply whose stream the browser would reopen for ever.
        message = {**message, "status": "error", "content": "".join(job.result.get("text", [])),
                   "error": job.error or "The reply could not be saved."}
    return render_template("chat/_message_final.html", message_row=with_token_views([message])[0],
                           conversation_id=conversation_id, is_last=messages[-1]["id"] == message_id)


@bp.post("/c/<conversation_id>/m/<int:message_id>/view")
def toggle_token_view(conversation_id: str, message_id: int):
    """Read a reply as its tokens, shaded by their odds, or as text again; kept with the reply."""
    owned_message(conversation_id, message_id)
    service().set_token_view(conversation_id, message_id, request.form.get("view") == "tokens")
    if is_htmx() and request.form.get("live"):  # a streaming reply: app.js flipped it, kept for its end
        return "", 204
    if is_htmx():
        return render_message(conversation_id, message_id)
    return redirect(url_for("chat.conversation", conversation_id=conversation_id) + f"#message-{message_id}", 303)


@bp.post("/c/<conversation_id>/m/<int:message_id>/stop")
def stop(conversation_id: str, message_id: int):
    owned_message(conversation_id, message_id)
    service().stop(message_id)
    if is_htmx():
        return "", 204
    wait_for_reply(message_id)
    return redirect(url_for("chat.conversation", conversation_id=conversation_id), 303)


@bp.post("/c/<conversation_id>/regenerate")
def regenerate(conversation_id: str):
    """A new version of the last reply, after the same question; the old one stays, a click away."""
    conversation = owned_conversation(conversation_id)
    try:
        sampling = parse_sampling(request.form, default_max_new_tokens=settings().max_new_tokens,
                                  max_new_tokens_limit=sampling_limit())
    except FormError as error:
        return composer_error(conversation, "", error)
    try:
        turn = service().regenerate_turn(conversation, sampling)
    except PromptTooLong as error:
        return composer_error(conversation, "", str(error), sampling)
    except ChatError as error:
        abort(error.status, str(error))
    return start_reply(turn)


@bp.post("/c/<conversation_id>/m/<int:message_id>/edit")
def edit(conversation_id: str, message_id: int):
    """A new version of a question, beside the old one (kept, with the replies that followed it)."""
    conversation = owned_conversation(conversation_id)
    message = owned_message(conversation_id, message_id)
    try:
        content = parse_content(request.form, settings().max_message_chars)
        sampling = parse_sampling(request.form, default_max_new_tokens=settings().max_new_tokens,
                                  max_new_tokens_limit=sampling_limit())
    except FormError as error:
        return composer_error(conversation, request.form.get("content", ""), error)
    try:
        turn = service().edit_turn(conversation, message, content, sampling)
    except PromptTooLong as error:
        return composer_error(conversation, content, str(error), sampling)
    except ChatError as error:
        abort(error.status, str(error))
    return start_reply(turn, draft=content)


@bp.get("/c/<conversation_id>/delete")
def confirm_delete(conversation_id: str):
    """Without JavaScript, Delete asks first, on a page of its own."""
    return render_template("chat/delete.html", conversation=owned_conversation(conversation_id))


@bp.post("/c/<conversation_id>/delete")
def delete(conversation_id: str):
    owned_conversation(conversation_id)
    service().delete(owner_id(), conversation_id)
    if is_htmx():
        response = current_app.make_response(("", 204))
        response.headers["HX-Redirect"] = url_for("chat.index")
        return response
    return redirect(url_for("chat.index"), 303)


# -- export -----------------------------------------------------------------------------------
@bp.get("/c/<conversation_id>/export.<fmt>")
def export(conversation_id: str, fmt: str):
    conversation = owned_conversation(conversation_id)
    messages = service().history(conversation_id)
    filename = f"glassbox-chat-{conversation_id}.{fmt}"
    disposition = {"Content-Disposition": f'attachment; filename="{filename}"'}
    if fmt == "json":  # the branch shown; ?branches=all adds every version (each with its parent_id)
        data = {"conversation": conversation, "messages": messages}
        if request.args.get("branches") == "all":
            data["all_messages"] = service().all_messages(conversation_id)
        body = json.dumps(data, indent=2, ensure_ascii=False)
        return Response(body, mimetype="application/json", headers=disposition)
    if fmt == "md":
        body = render_template("chat/export.md.txt", conversation=conversation, messages=messages)
        return Response(body, mimetype="text/markdown", headers=disposition)
    abort(404, "Export as .md or .json.")


from webapp.chat import glass_views, share_views  # noqa: E402,F401  (more routes of this blueprint)
