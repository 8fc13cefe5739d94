"""Chat pages and streams: a conversation, sending, the reply's stream, stop, regenerate, edit, delete,
export. Views parse and validate, call the service, render a template."""

from __future__ import annotations

import json

from flask import Response, abort, current_app, redirect, render_template, request, session, url_for

from webapp.chat.decode.publish import TokenEvent
from webapp.chat.model.prompt import PromptTooLong
from webapp.chat.records import Status
from webapp.chat.service import ChatError
from webapp.chat.web import exports, token_views
from webapp.chat.web.blueprint import bp, owned_conversation, owned_message, owned_page, service, settings
from webapp.chat.web.composer import (
    composer_error,
    default_sampling,
    page_context,
    render_message,
    render_page,
    sampling_limit,
    start_reply,
    too_long,
    wait_for_reply,
)
from webapp.chat.web.forms import FormError, parse_content, parse_message, parse_sampling
from webapp.chat.web.pace import paced, presentation_pace
from webapp.web import is_htmx
from webapp.web.security import owner_id
from webapp.web.sse import finished_stream, stream_events, stream_job


@bp.post("/sampling/reset")
def reset_sampling():
    """Forget this browser's sampling settings; the draft stays."""
    session.pop("sampling", None)
    conversation_id = request.form.get("conversation_id", "")
    page = owned_page(conversation_id) if conversation_id else None
    if is_htmx():
        return render_template("chat/_composer.html", **page_context(page, default_sampling(),
                                                                     draft=request.form.get("content", ""), reset=True))
    target = (url_for("chat.conversation", conversation_id=conversation_id) if page
              else url_for("chat.index"))
    return redirect(target, 303)


# -- pages ------------------------------------------------------------------------------------
@bp.get("/")
def index():
    return render_page(owned_page(None))


@bp.get("/c/<conversation_id>")
def conversation(conversation_id: str):
    """A conversation; ?beside=<reply id> shows that version of the last reply beside it (two models)."""
    return render_page(owned_page(conversation_id), beside=request.args.get("beside", type=int))


# -- sending and replying ---------------------------------------------------------------------
@bp.post("/send")
def send():
    svc, form = service(), request.form
    page = owned_page(form.get("conversation_id", ""))  # the conversation, its branch shown, the sidebar: once
    draft = form.get("content", "")
    try:
        content, sampling = parse_message(form, settings().max_message_chars,
                                          default_max_new_tokens=settings().max_new_tokens,
                                          max_new_tokens_limit=sampling_limit())
    except FormError as error:  # every field's error at once
        return composer_error(page, draft, error)
    also = form.get("also_model", "")
    try:
        turn = svc.send_turn(page.conversation, content, sampling, history=page.messages,
                             model=form.get("model") or None)
        second = svc.second_turn(turn, also, page.messages) if also else None  # ask two models at once
    except PromptTooLong as error:
        return composer_error(page, draft, too_long(error), sampling)
    except ChatError as error:
        field = "model" if error.status == 400 else "content"
        return composer_error(page, draft, str(error), sampling, error.status, field=field)
    # an example (the empty chat's buttons) is sent at its own temperature, which the browser does not keep
    return start_reply(turn, page, draft=draft, second=second, borrowed=form.get("example") == "1")


@bp.get("/c/<conversation_id>/m/<int:message_id>/stream")
def stream(conversation_id: str, message_id: int):
    message = owned_message(conversation_id, message_id)
    job = service().job_for(message_id)
    if message.status != Status.PENDING:
        return finished_stream(render_message(conversation_id, message_id))

    def render(event):
        if event.name == "token" and isinstance(event.data, TokenEvent):
            odds = event.data.odds  # a typed token's are None (Forced), so odds given here have a probability
            shade = token_views.shade(odds.probability) if odds and odds.probability is not None else None
            return render_template("chat/_token.html", text=event.data.text, shade=shade, odds=odds)
        if event.name in ("position", "running"):
            return render_template("chat/_reply_status.html", event=event)
        return None

    pace = presentation_pace()  # GLASSBOX_PRESENTATION_PACE: 0 leaves the events as they come
    if job is None:  # another front end runs it (docs/scaling.md): follow what it saves
        return stream_events(paced(service().follow(message_id, settings().heartbeat_seconds), pace), render,
                             lambda: render_message(conversation_id, message_id))
    if pace:
        return stream_events(paced(job.subscribe_batches(settings().heartbeat_seconds), pace), render,
                             lambda: render_message(conversation_id, message_id, job))
    return stream_job(job, render, lambda job: render_message(conversation_id, message_id, job))


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
    page = owned_page(conversation_id)
    assert page.conversation is not None
    try:
        sampling = parse_sampling(request.form, default_max_new_tokens=settings().max_new_tokens,
                                  max_new_tokens_limit=sampling_limit())
    except FormError as error:
        return composer_error(page, "", error)
    try:
        turn = service().regenerate_turn(page.conversation, sampling, history=page.messages,
                                         model=request.form.get("model") or None)
    except PromptTooLong as error:
        return composer_error(page, "", str(error), sampling)
    except ChatError as error:
        abort(error.status, str(error))
    return start_reply(turn, page)


@bp.post("/c/<conversation_id>/m/<int:message_id>/edit")
def edit(conversation_id: str, message_id: int):
    """A new version of a question, beside the old one (kept, with the replies that followed it)."""
    page = owned_page(conversation_id)
    assert page.conversation is not None
    message = page.tree.get(message_id)  # every version of every message, read with the page
    if message is None:
        abort(404, "No such message.")
    try:
        content = parse_content(request.form, settings().max_message_chars)
        sampling = parse_sampling(request.form, default_max_new_tokens=settings().max_new_tokens,
                                  max_new_tokens_limit=sampling_limit())
    except FormError as error:
        return composer_error(page, request.form.get("content", ""), error)
    try:
        turn = service().edit_turn(page.conversation, message, content, sampling, history=page.messages)
    except PromptTooLong as error:
        return composer_error(page, content, str(error), sampling)
    except ChatError as error:
        abort(error.status, str(error))
    return start_reply(turn, page, draft=content)


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
    messages = exports.with_tokens(service(), service().history(conversation_id))
    filename = f"glassbox-chat-{conversation_id}.{fmt}"
    disposition = {"Content-Disposition": f'attachment; filename="{filename}"'}
    if fmt == "json":  # the branch shown; ?branches=all adds every version (each with its parent_id)
        data = {"conversation": conversation.as_dict(), "messages": messages}
        if request.args.get("branches") == "all":
            data["all_messages"] = [m.as_dict() for m in service().all_messages(conversation_id)]
        body = json.dumps(data, indent=2, ensure_ascii=False)
        return Response(body, mimetype="application/json", headers=disposition)
    if fmt == "md":
        body = render_template("chat/export.md.txt", conversation=conversation, messages=messages)
        return Response(body, mimetype="text/markdown", headers=disposition)
    abort(404, "Export as .md or .json.")


