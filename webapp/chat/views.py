"""Chat pages and streams.  Views parse and validate, call the service, render a template."""

from __future__ import annotations

import json

from flask import (Blueprint, Response, abort, current_app, g, redirect, render_template, request,
                   session, url_for)

from webapp.chat import glass
from webapp.chat.forms import (FormError, FormErrors, Sampling, parse_content, parse_message, parse_sampling,
                               remembered_sampling, submitted_sampling)
from webapp.chat.prompt import PromptReport, PromptTooLong
from webapp.chat.service import ChatService
from webapp.chat.store import ROOT, ChatStore
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
                sampling: Sampling | None = None, status: int = 200, typed: dict | None = None):
    svc = service()
    messages = svc.store.messages(conversation["id"]) if conversation else []
    body = render_template("chat/page.html", conversation=conversation, messages=messages,
                           conversations=svc.store.conversations(owner_id()), draft=draft,
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
    history = service().store.messages(conversation["id"]) if conversation else []
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
    history = svc.store.messages(conversation["id"]) if conversation else []
    if len(history) + 2 > settings().max_messages:
        return composer_error(conversation, draft, f"This conversation has reached its limit of "
                              f"{settings().max_messages} messages. Start a new chat.", sampling, 400)
    history = history + [{"role": "user", "content": content, "status": "complete"}]
    try:
        prompt = svc.check_prompt(history, sampling)
    except PromptTooLong as error:
        return composer_error(conversation, draft, too_long(error), sampling)
    return start_reply(conversation, prompt, sampling, new_user_text=content, draft=draft)


def start_reply(conversation, prompt, sampling, *, new_user_text=None, draft="", branch_from=None, forced=None):
    """Save and queue a checked prompt; answer htmx with the conversation, a form with the reply.

    branch_from: a message id: the new message is a new version after it (a regenerated reply after its
    question, an edited question after the reply before it), beside the old one, which is kept.
    forced: the reply's first tokens (a branch from a token), see ChatService.start_reply."""
    svc, owner = service(), owner_id()
    created = conversation is None
    storage.check_chat(owner, new_conversation=created)  # the browser's quotas (403 with a message)
    # Without JavaScript the form waits for the whole reply: that holds a stream slot, taken before
    # anything is saved, so that "no slot free" (503) leaves nothing behind.
    slot = None if is_htmx() else take_slot()
    try:
        return _start_reply(svc, owner, conversation, created, prompt, sampling, new_user_text, draft, slot,
                            branch_from, forced)
    finally:
        if slot is not None:
            slot.release()


def _start_reply(svc, owner, conversation, created, prompt, sampling, new_user_text, draft, slot,
                 branch_from=None, forced=None):
    if created:
        conversation = svc.store.conversation(owner, svc.store.create_conversation(owner, new_user_text))
    shown = svc.store.leaf(conversation["id"])  # the branch shown now, shown again if the job is refused
    if branch_from is not None:
        svc.store.show_message(conversation["id"], branch_from, descend=False)
    user_id = svc.store.add_message(conversation["id"], "user", new_user_text) if new_user_text else None

    def take_back():  # what was saved for a reply that will not come; the branch shown as it was
        if user_id is not None:
            svc.store.delete_message(conversation["id"], user_id, show=shown)
        elif not created:
            svc.store.show_message(conversation["id"], shown, descend=False)
        if created:
            svc.store.delete_conversation(owner, conversation["id"])

    try:
        reply_id = svc.start_reply(owner, conversation["id"], prompt, sampling, forced=forced)
    except Refused as error:
        take_back()
        return composer_error(None if created else conversation, draft, str(error), sampling,
                              refusal_status(error), headers=refusal_headers(error))
    except Exception:
        take_back()
        raise
    session["sampling"] = sampling.as_dict()  # this browser's settings, until it resets them
    if slot is not None:
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

    return stream_job(job, render, lambda job: render_message(conversation_id, message_id, job))


def render_message(conversation_id: str, message_id: int, job=None) -> str:
    store = service().store
    messages = store.messages(conversation_id)
    message = next((m for m in messages if m["id"] == message_id), None)
    if message is None:
        return ""
    if message["status"] == "pending" and job is not None and job.finished_state:
        # Its job ended but the reply could not be saved (disk full, read-only database): show the
        # job's own outcome, never a pending reply whose stream the browser would reopen for ever.
        message = {**message, "status": "error", "content": "".join(job.result.get("text", [])),
                   "error": job.error or "The reply could not be saved."}
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


@bp.post("/c/<conversation_id>/m/<int:message_id>/branch")
def branch(conversation_id: str, message_id: int):
    """Continue a reply from one of its tokens with another token (an alternative, or text typed): the
    tokens before it are kept, the new one is forced, the model goes on with the reply's settings. The
    result is a new version of the reply; the old one stays."""
    conversation = owned_conversation(conversation_id)
    message, details = reply_details(conversation_id, message_id)
    svc = service()
    if message["status"] == "pending" or any(m["status"] == "pending" for m in svc.store.messages(conversation_id)):
        abort(409, "Stop the running reply before branching.")
    if not details["odds"] or not details["prompt"]:
        abort(409, "This reply was saved before Glassbox kept its tokens, so it cannot be branched.")
    try:
        forced = glass.branch_tokens(svc.model.tokenizer, details["odds"], request.form,
                                     settings().max_message_chars)
    except ValueError as error:
        abort(400, str(error))
    sampling = Sampling(**{k: v for k, v in (message["settings"] or {}).items()
                           if k in ("max_new_tokens", "temperature", "top_k", "seed")})
    if len(forced.tokens) > sampling.max_new_tokens:
        abort(400, f"That continuation is longer than the reply may be ({sampling.max_new_tokens} tokens).")
    prompt = PromptReport.from_dict(details["prompt"])
    return start_reply(conversation, prompt, sampling, branch_from=message["parent_id"] or ROOT, forced=forced)


@bp.get("/c/<conversation_id>/m/<int:message_id>/compare/<int:other_id>")
def compare(conversation_id: str, message_id: int, other_id: int):
    """Two versions of a reply side by side: where their tokens first differ, and the odds there."""
    message, details = reply_details(conversation_id, message_id)
    other, other_details = reply_details(conversation_id, other_id)
    if message["parent_id"] != other["parent_id"]:
        abort(404, "These replies answer different messages.")
    tokenizer = service().model.tokenizer
    a, b = (glass.token_views(tokenizer, d["odds"] or []) for d in (details, other_details))
    first = glass.first_difference(a, b)
    return render_template("chat/compare.html", conversation=owned_conversation(conversation_id),
                           sides=[(message, a), (other, b)], first=first)


@bp.get("/c/<conversation_id>/m/<int:message_id>/prompt")
def prompt(conversation_id: str, message_id: int):
    """The exact token ids the model was given for a reply, part by part, with the budget arithmetic."""
    message, details = reply_details(conversation_id, message_id)
    if details["prompt"] is None:
        abort(404, "This reply was saved before Glassbox kept prompts.")
    report, parts = glass.prompt_view(service().model.tokenizer, details["prompt"])
    return render_template("chat/prompt.html", conversation=owned_conversation(conversation_id), message=message,
                           report=report, parts=parts)


@bp.post("/c/<conversation_id>/m/<int:message_id>/show")
def show(conversation_id: str, message_id: int):
    """Show another version of a message (‹ 2/3 ›), and the branch that follows it."""
    conversation = owned_conversation(conversation_id)
    owned_message(conversation_id, message_id)
    svc = service()
    if any(m["status"] == "pending" for m in svc.store.messages(conversation_id)):
        abort(409, "Stop the running reply before switching versions.")
    svc.store.show_message(conversation_id, message_id)
    if is_htmx():
        return reply_fragment(conversation, False, default_sampling())
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
    # a new version of the reply, after the same question; the old one stays, a click away
    return start_reply(conversation, prompt, sampling, branch_from=history[-1]["parent_id"])


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
    path = svc.store.messages(conversation_id)
    shown = [m["id"] for m in path]
    if message_id not in shown:
        abort(409, "That message is on a branch not shown; show it first.")
    history = path[:shown.index(message_id)] + [{**message, "content": content}]
    try:
        prompt = svc.check_prompt(history, sampling)
    except PromptTooLong as error:
        return composer_error(conversation, content, str(error), sampling)
    # a new version of the question, beside the old one (kept, with the replies that followed it)
    return start_reply(conversation, prompt, sampling, new_user_text=content, draft=content,
                       branch_from=message["parent_id"] or ROOT)


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
    if fmt == "json":  # the branch shown; ?branches=all adds every version (each with its parent_id)
        data = {"conversation": conversation, "messages": messages}
        if request.args.get("branches") == "all":
            data["all_messages"] = service().store.all_messages(conversation_id)
        body = json.dumps(data, indent=2, ensure_ascii=False)
        return Response(body, mimetype="application/json", headers=disposition)
    if fmt == "md":
        body = render_template("chat/export.md.txt", conversation=conversation, messages=messages)
        return Response(body, mimetype="text/markdown", headers=disposition)
    abort(404, "Export as .md or .json.")
