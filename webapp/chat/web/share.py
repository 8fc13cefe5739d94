"""Read-only links to a conversation, made on purpose by its owner, revocable.

The conversation's own address stays private to the browser that made it; a shared link opens the branch
shown, read-only, for anyone on the intranet who has it (no editing, no new replies, no streams): each reply's
tokens and odds, its prompt, Inside, and its other versions compared with it. No link on these pages names the
conversation's own id: they all go through the share token, so unsharing closes every one of them."""

from __future__ import annotations

from flask import abort, g, redirect, render_template, url_for

from webapp.chat.records import Conversation, Message, ReplyDetails
from webapp.chat.service import ChatError
from webapp.chat.web import token_views as glass
from webapp.chat.web.blueprint import bp, owned_conversation, service
from webapp.chat.web.composer import token_views_of
from webapp.chat.web.glass import compare_page, panel_fragment, tokens_page
from webapp.web import follow
from webapp.web.security import owner_id

SHARING_STOPPED = "This shared conversation does not exist, or its owner stopped sharing it."


def shared_conversation(token: str) -> tuple[Conversation, list[Message]] | None:
    """The conversation a share link opens, and its branch shown; or a follow link's (issue 51: a presented
    conversation's followers see the presenter's views through these same read-only pages, and never start a
    job there: `g.follower`, read by webapp/chat/inside/waiting.py). None: neither, or revoked."""
    found = service().shared(token)
    if found is None:
        link = follow.links().get(token)
        conversation = service().store.conversation(link.owner, link.target) if link and link.kind == "chat" else None
        if conversation is not None:
            g.follower, g.follow_token = True, token
            found = conversation, service().history(conversation.id)
    return found


def shared_message(token: str, message_id: int) -> tuple[Conversation, Message]:
    """A message of the conversation a shared link opens: one of the branch shown, or another version of it
    (Compare shows those side by side). 404 for a message of any other conversation."""
    found = shared_conversation(token)
    if found is None:
        abort(404, SHARING_STOPPED)
    conversation, messages = found
    message = next((m for m in messages if m.id == message_id), None)
    if message is None:
        message = service().message(conversation.id, message_id)
    if message is None:
        abort(404, "No such message in this shared conversation.")
    return conversation, message


@bp.post("/c/<conversation_id>/share")
def share(conversation_id: str):
    owned_conversation(conversation_id)
    service().share(owner_id(), conversation_id)
    return redirect(url_for("chat.conversation", conversation_id=conversation_id, _anchor="share"), 303)


@bp.post("/c/<conversation_id>/unshare")
def unshare(conversation_id: str):
    owned_conversation(conversation_id)
    service().stop_sharing(owner_id(), conversation_id)
    return redirect(url_for("chat.conversation", conversation_id=conversation_id, _anchor="share"), 303)


@bp.get("/shared/<token>")
def shared(token: str):
    found = shared_conversation(token)
    if found is None:
        abort(404, SHARING_STOPPED)
    conversation, messages = found
    return render_template("chat/shared.html", conversation=conversation, messages=messages, share_token=token,
                           token_views=token_views_of(messages, chosen=False))


@bp.get("/shared/<token>/m/<int:message_id>/prompt")
def shared_prompt(token: str, message_id: int):
    """The exact prompt of a reply of a shared conversation, read-only."""
    conversation, message = shared_message(token, message_id)
    if message.role != "assistant":
        abort(404, "Only replies have a prompt.")
    details = service().details(message_id)
    if details.prompt is None or "prompt" in details.damaged:
        abort(404, glass.DAMAGED_PROMPT)
    try:
        tokenizer = service().writer(message).tokenizer
        report, parts = glass.prompt_view(tokenizer, details.prompt)
    except ChatError as error:
        abort(error.status, str(error))
    except (TypeError, ValueError, IndexError, KeyError):  # JSON, but not what this code wrote
        abort(404, glass.DAMAGED_PROMPT)
    return render_template("chat/prompt.html", conversation=conversation, message=message, report=report,
                           parts=parts, shared=token)


def shared_reply(token: str, message_id: int) -> tuple[Conversation, Message, ReplyDetails]:
    """(conversation, reply, its details) of a shared conversation; 404 for a question, or anything else."""
    conversation, message = shared_message(token, message_id)
    if message.role != "assistant":
        abort(404, "Only replies have tokens and a prompt.")
    return conversation, message, service().details(message_id)


@bp.get("/shared/<token>/m/<int:message_id>/tokens")
def shared_tokens(token: str, message_id: int):
    """A shared reply's tokens with their odds, read-only: no branching, no switching parts off."""
    conversation, message, details = shared_reply(token, message_id)
    return tokens_page(conversation, message, details, shared=token)


@bp.get("/shared/<token>/m/<int:message_id>/tokens/<int:index>")
def shared_token_panel(token: str, message_id: int, index: int):
    _, message, details = shared_reply(token, message_id)
    return panel_fragment(message, details, index, shared=token)


@bp.get("/shared/<token>/m/<int:message_id>/compare/<int:other_id>")
def shared_compare(token: str, message_id: int, other_id: int):
    """Two versions of a shared reply side by side; both must be of the shared conversation."""
    conversation, message, details = shared_reply(token, message_id)
    other = shared_reply(token, other_id)
    return compare_page(conversation, (message, details), other[1:], shared=token)
