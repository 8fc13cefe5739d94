"""Chat pages and streams.  Views parse and validate, call the service, render a template."""

from __future__ import annotations

import json

from flask import (Blueprint, Response, abort, current_app, g, redirect, render_template, request,
                   url_for)

from webapp.chat import glass
from webapp.chat.forms import FormError, Sampling, parse_content, parse_sampling
from webapp.chat.prompt import PromptTooLong
from webapp.chat.service import ChatService
from webapp.chat.store import ChatStore
from webapp.core import Refused
from webapp.web import get_core, refusal_headers, refusal_status
from webapp.web.sse import finished_stream, stream_job
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
    conversation = service().store.conversation(owner_id(), conversation_id)
    if conversation is None:
        abort(404, "No such conversation.")
    return conversation


def owned_message(conversation_id: str, message_id: int) -> dict:
    owned_conversation(conversation_id)
    message = service().store.message(conversation_id, message_id)
    if message is None:
        abort(404, "No such message.")
    return message


def sampling_limit() -> int:
    return service().max_new_tokens_limit()


def render_page(conversation: dict | None, *, draft: str = "", errors: dict | None = None,
                sampling: Sampling | None = None, status: int = 200):
    svc = service()
    messages = svc.store.messages(conversation["id"]) if conversation else []
    body = render_template("chat/page.html", conversation=conversation, messages=messages,
                           conversations=svc.store.conversations(owner_id()), draft=draft,
                           errors=errors or {}, sampling=sampling or default_sampling(),
                           max_new_tokens_limit=sampling_limit())
    return body, status


def default_sampling() -> Sampling:
    return Sampling(max_new_tokens=min(settings().max_new_tokens, sampling_limit()))


def composer_error(conversation, draft, error: FormError | str, sampling=None, status=400, field="content",
                   headers: dict | None = None):
    """Bad input: say what is wrong beside the field and give the text back, nothing saved."""
    errors = {error.field: error.message} if isinstance(error, FormError) else {field: error}
    if is_htmx():
        html = render_template("chat/_composer.html", conversation=conversation, draft=draft, errors=errors,
                               sampling=sampling or default_sampling(), max_new_tokens_limit=sampling_limit())
        return html, status, {"HX-Retarget": "#composer", "HX-Reswap": "outerHTML", **(headers or {})}
    body, status = render_page(conversation, draft=draft, errors=errors, sampling=sampling, status=status)
    return body, status, headers or {}


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
        content = parse_content(form, settings().max_message_chars)
        sampling = parse_sampling(form, default_max_new_tokens=settings().max_new_tokens,
                                  max_new_tokens_limit=sampling_limit())
    except FormError as error:
        return composer_error(conversation, draft, error)
    history = svc.store.messages(conversation["id"]) if conversation else []
    if len(history) + 2 > settings().max_messages:
        return composer_error(conversation, draft, f"This conversation has reached its limit of "
                              f"{settings().max_messages} messages. Start a new chat.", sampling, 400)
    history = history + [{"role": "user", "content": content, "status": "complete"}]
    try:
        prompt = svc.check_prompt(history, sampling)
    except PromptTooLong as error:
        return composer_error(conversation, draft, str(error), sampling)
    return start_reply(conversation, prompt, sampling, new_user_text=content, draft=draft)


def start_reply(conversation, prompt, sampling, *, new_user_text=None, draft="", then=None):
    """Save and queue a checked prompt; answer htmx with the conversation, a form with the reply.

    then(reply_id): the store changes the reply replaces, made once the job is accepted."""
    svc, owner = service(), owner_id()
    created = conversation is None
    if created:
        conversation = svc.store.conversation(owner, svc.store.create_conversation(owner, new_user_text))
    user_id = svc.store.add_message(conversation["id"], "user", new_user_text) if new_user_text else None
    try:
        reply_id = svc.start_reply(owner, conversation["id"], prompt, sampling, then=then)
    except Refused as error:  # take back what was saved for it
        if user_id is not None:
            svc.store.delete_message(conversation["id"], user_id)
        if created:
            svc.store.delete_conversation(owner, conversation["id"])
        return composer_error(None if created else conversation, draft, str(error), sampling,
                              refusal_status(error), headers=refusal_headers(error))
    if not is_htmx():
        wait_for_reply(reply_id)
        return redirect(url_for("chat.conversation", conversation_id=conversation["id"]), 303)
    return reply_fragment(conversation, created, sampling)


def reply_fragment(conversation, created, sampling):
    store = service().store
    response = current_app.make_response(render_template(
        "chat/_conversation_swap.html", conversation=conversation,
        messages=store.messages(conversation["id"]), conversations=store.conversations(owner_id()),
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

    return stream_job(job, render, lambda _job: render_message(conversation_id, message_id))


def render_message(conversation_id: str, message_id: int) -> str:
    store = service().store
    messages = store.messages(conversation_id)
    message = next((m for m in messages if m["id"] == message_id), None)
    if message is None:
        return ""
    return render_template("chat/_message_final.html", message_row=message, conversation_id=conversation_id,
                           is_last=messages[-1]["id"] == message_id)


# -- the glass box: a reply's tokens with their odds, and the exact prompt it was given ---------------
def reply_details(conversation_id: str, message_id: int) -> tuple[dict, dict]:
    message = owned_message(conversation_id, message_id)
    if message["role"] != "assistant":
        abort(404, "Only replies have tokens and a prompt.")
    return message, service().store.details(message_id)


@bp.get("/c/<conversation_id>/m/<int:message_id>/tokens")
def tokens(conversation_id: str, message_id: int):
    """Every token of a reply shaded by its probability; ?t=N shows token N's alternatives (no JS needed)."""
    message, details = reply_details(conversation_id, message_id)
    views = glass.token_views(service().model.tokenizer, details["odds"] or [])
    selected = request.args.get("t", type=int)
    selected = selected if selected is not None and 0 <= selected < len(views) else None
    return render_template("chat/tokens.html", conversation=owned_conversation(conversation_id), message=message,
                           tokens=views, selected=selected, settings=message["settings"] or {})


@bp.get("/c/<conversation_id>/m/<int:message_id>/tokens/<int:index>")
def token_panel(conversation_id: str, message_id: int, index: int):
    """One token's alternatives, as the fragment htmx puts in the token view's panel."""
    message, details = reply_details(conversation_id, message_id)
    views = glass.token_views(service().model.tokenizer, details["odds"] or [])
    if not 0 <= index < len(views):
        abort(404, "No such token in this reply.")
    return render_template("chat/_token_panel.html", token=views[index], message=message)


@bp.get("/c/<conversation_id>/m/<int:message_id>/prompt")
def prompt(conversation_id: str, message_id: int):
    """The exact token ids the model was given for a reply, part by part, with the budget arithmetic."""
    message, details = reply_details(conversation_id, message_id)
    if details["prompt"] is None:
        abort(404, "This reply was saved before Glassbox kept prompts.")
    report, parts = glass.prompt_view(service().model.tokenizer, details["prompt"])
    return render_template("chat/prompt.html", conversation=owned_conversation(conversation_id), message=message,
                           report=report, parts=parts)


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
    conversation = owned_conversation(conversation_id)
    svc = service()
    history = svc.store.messages(conversation_id)
    if not history or history[-1]["role"] != "assistant" or history[-1]["status"] == "pending":
        abort(409, "There is no finished reply to regenerate.")
    try:
        sampling = parse_sampling(request.form, default_max_new_tokens=settings().max_new_tokens,
                                  max_new_tokens_limit=sampling_limit())
    except FormError as error:
        return composer_error(conversation, "", error)
    try:
        prompt = svc.check_prompt(history[:-1], sampling)
    except PromptTooLong as error:
        return composer_error(conversation, "", str(error), sampling)
    old_reply = history[-1]["id"]
    return start_reply(conversation, prompt, sampling,
                       then=lambda reply_id: svc.store.delete_message(conversation_id, old_reply))


@bp.post("/c/<conversation_id>/m/<int:message_id>/edit")
def edit(conversation_id: str, message_id: int):
    conversation = owned_conversation(conversation_id)
    message = owned_message(conversation_id, message_id)
    svc = service()
    if message["role"] != "user":
        abort(409, "Only your own messages can be edited.")
    if any(m["status"] == "pending" for m in svc.store.messages(conversation_id)):
        abort(409, "Stop the running reply before editing.")
    try:
        content = parse_content(request.form, settings().max_message_chars)
        sampling = parse_sampling(request.form, default_max_new_tokens=settings().max_new_tokens,
                                  max_new_tokens_limit=sampling_limit())
    except FormError as error:
        return composer_error(conversation, request.form.get("content", ""), error)
    history = [m for m in svc.store.messages(conversation_id) if m["id"] < message_id]
    history.append({**message, "content": content})
    try:
        prompt = svc.check_prompt(history, sampling)
    except PromptTooLong as error:
        return composer_error(conversation, content, str(error), sampling)
    return start_reply(conversation, prompt, sampling, draft=content,
                       then=lambda reply_id: svc.store.edit_message(conversation_id, message_id, content,
                                                                     keep=reply_id))


@bp.post("/c/<conversation_id>/delete")
def delete(conversation_id: str):
    owned_conversation(conversation_id)
    service().store.delete_conversation(owner_id(), conversation_id)
    if is_htmx():
        response = current_app.make_response(("", 204))
        response.headers["HX-Redirect"] = url_for("chat.index")
        return response
    return redirect(url_for("chat.index"), 303)


# -- export -----------------------------------------------------------------------------------
@bp.get("/c/<conversation_id>/export.<fmt>")
def export(conversation_id: str, fmt: str):
    conversation = owned_conversation(conversation_id)
    messages = service().store.messages(conversation_id)
    filename = f"glassbox-chat-{conversation_id}.{fmt}"
    disposition = {"Content-Disposition": f'attachment; filename="{filename}"'}
    if fmt == "json":
        body = json.dumps({"conversation": conversation, "messages": messages}, indent=2, ensure_ascii=False)
        return Response(body, mimetype="application/json", headers=disposition)
    if fmt == "md":
        body = render_template("chat/export.md.txt", conversation=conversation, messages=messages)
        return Response(body, mimetype="text/markdown", headers=disposition)
    abort(404, "Export as .md or .json.")
