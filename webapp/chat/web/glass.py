"""The glass-box views of a reply: its tokens with their odds, a token's alternatives, branching from a
token, two versions side by side, the exact prompt, and switching versions."""

from __future__ import annotations

from flask import abort, redirect, render_template, request, url_for

from webapp.chat.records import Conversation, Message, ReplyDetails
from webapp.chat.service import ChatError
from webapp.chat.web import token_views as glass
from webapp.chat.web.blueprint import bp, owned_conversation, owned_message, owned_page, service, settings
from webapp.chat.web.composer import default_sampling, reply_fragment, start_reply
from webapp.chat.web.presenter_view import show_followers
from webapp.web import is_htmx


def tokenizer_of(message: Message):
    """The tokenizer of the model that wrote a reply: its ids read as another model's would be wrong
    text. 409 naming that model when this server does not run it (or runs another file under its name)."""
    try:
        return service().writer(message).tokenizer
    except ChatError as error:
        abort(error.status, str(error))


def reply_details(conversation_id: str, message_id: int) -> tuple[Message, ReplyDetails]:
    message = owned_message(conversation_id, message_id)
    if message.role != "assistant":
        abort(404, "Only replies have tokens and a prompt.")
    return message, service().details(message_id)


@bp.get("/c/<conversation_id>/m/<int:message_id>/tokens")
def tokens(conversation_id: str, message_id: int):
    """Every token of a reply shaded by its probability; ?t=N shows token N's alternatives (no JS needed)."""
    message, details = reply_details(conversation_id, message_id)
    page = tokens_page(owned_conversation(conversation_id), message, details)
    return show_followers(page, conversation_id, message_id, "tokens", "the reply's tokens", keep=("t",))


@bp.get("/c/<conversation_id>/m/<int:message_id>/tokens/<int:index>")
def token_panel(conversation_id: str, message_id: int, index: int):
    """One token's alternatives, as the fragment htmx puts in the token view's panel."""
    return panel_fragment(*reply_details(conversation_id, message_id), index)


def tokens_page(conversation: Conversation, message: Message, details: ReplyDetails, shared: str | None = None):
    """The Tokens page, the owner's or (`shared`: the share token) read-only through a share link."""
    views, damaged = glass.readable_token_views(tokenizer_of(message), details)
    selected = request.args.get("t", type=int)
    selected = selected if selected is not None and 0 <= selected < len(views) else None
    return render_template("chat/tokens.html", conversation=conversation, message=message, tokens=views,
                           selected=selected, settings=message.settings or {}, damaged=damaged, shared=shared)


def panel_fragment(message: Message, details: ReplyDetails, index: int, shared: str | None = None):
    views, damaged = glass.readable_token_views(tokenizer_of(message), details)
    if not 0 <= index < len(views):
        abort(404, damaged or "No such token in this reply.")
    return render_template("chat/_token_panel.html", token=views[index], message=message, shared=shared)


@bp.post("/c/<conversation_id>/m/<int:message_id>/branch")
def branch(conversation_id: str, message_id: int):
    """Continue a reply from one of its tokens with another token (an alternative, or text typed): the
    tokens before it are kept, the new one is forced, the model goes on with the reply's settings. The
    result is a new version of the reply; the old one stays."""
    page = owned_page(conversation_id)
    assert page.conversation is not None
    message, details = reply_details(conversation_id, message_id)
    svc = service()
    tokenizer = tokenizer_of(message)
    if glass.readable_token_views(tokenizer, details)[1] or "prompt" in details.damaged:
        abort(409, "This reply's saved tokens or prompt are damaged, so it cannot be branched.")
    try:
        forced = glass.branch_tokens(tokenizer, details.odds or [], request.form,
                                     settings().max_message_chars)
        turn = svc.branch_turn(page.conversation, message, forced, history=page.messages)
    except ValueError as error:  # the form asked for no token the reply has
        abort(400, str(error))
    except ChatError as error:
        abort(error.status, str(error))
    return start_reply(turn, page, borrowed=True)


@bp.get("/c/<conversation_id>/m/<int:message_id>/compare/<int:other_id>")
def compare(conversation_id: str, message_id: int, other_id: int):
    """Two versions of a reply side by side: where their tokens first differ, and the odds there."""
    page = compare_page(owned_conversation(conversation_id), reply_details(conversation_id, message_id),
                        reply_details(conversation_id, other_id))
    return show_followers(page, conversation_id, message_id, f"compare/{other_id}", "two versions side by side")


@bp.get("/c/<conversation_id>/m/<int:message_id>/compare")
def compare_with(conversation_id: str, message_id: int):
    """?other=<id>: the Compare form of a reply with three versions or more -> that pair's page (303)."""
    other = request.args.get("other", type=int)
    if other is None:
        abort(400, "Choose the version to compare with.")
    return redirect(url_for("chat.compare", conversation_id=conversation_id, message_id=message_id, other_id=other),
                    303)


def compare_page(conversation: Conversation, one: tuple[Message, ReplyDetails], two: tuple[Message, ReplyDetails],
                 shared: str | None = None):
    """Two replies of one conversation, (message, details) each: 404 unless they answer the same message."""
    (message, details), (other, other_details) = one, two
    if message.parent_id != other.parent_id:
        abort(404, "These replies answer different messages.")
    tokenizers = tokenizer_of(message), tokenizer_of(other)
    a, b = (glass.readable_token_views(t, d)[0] for t, d in zip(tokenizers, (details, other_details)))
    first = glass.first_difference(a, b, same_vocabulary=tokenizers[0].name == tokenizers[1].name)
    return render_template("chat/compare.html", conversation=conversation, sides=[(message, a), (other, b)],
                           first=first, shared=shared)


@bp.get("/c/<conversation_id>/m/<int:message_id>/prompt")
def prompt(conversation_id: str, message_id: int):
    """The exact token ids the model was given for a reply, part by part, with the budget arithmetic."""
    message, details = reply_details(conversation_id, message_id)
    if "prompt" in details.damaged:
        abort(404, glass.DAMAGED_PROMPT)
    if details.prompt is None:
        abort(404, "This reply was saved before Glassbox kept prompts.")
    try:
        report, parts = glass.prompt_view(tokenizer_of(message), details.prompt)
    except (TypeError, ValueError, IndexError, KeyError):  # JSON, but not what this code wrote
        abort(404, glass.DAMAGED_PROMPT)
    return render_template("chat/prompt.html", conversation=owned_conversation(conversation_id), message=message,
                           report=report, parts=parts)


@bp.post("/c/<conversation_id>/m/<int:message_id>/show")
def show(conversation_id: str, message_id: int):
    """Show another version of a message (‹ 2/3 ›), and the branch that follows it."""
    owned_message(conversation_id, message_id)
    try:
        service().show_version(conversation_id, message_id)
    except ChatError as error:
        abort(error.status, str(error))
    if is_htmx():
        return reply_fragment(owned_page(conversation_id), False, default_sampling())
    return redirect(url_for("chat.conversation", conversation_id=conversation_id) + f"#message-{message_id}", 303)
