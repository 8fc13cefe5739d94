"""The chat blueprint and what every chat route needs: the service, the settings, and the browser's own
conversations and messages (404 for anyone else's)."""

from __future__ import annotations

from flask import Blueprint, abort, current_app

from webapp.chat.records import ChatPage, Conversation, Message
from webapp.chat.service import ChatService
from webapp.config import Settings
from webapp.web.security import owner_id
from webapp.web.state import glassbox

bp = Blueprint("chat", __name__, url_prefix="/chat")


def service() -> ChatService:
    """The chat service create_app built (webapp/chat/boot.py)."""
    return glassbox().service(ChatService)


@bp.context_processor
def models_context() -> dict:
    """The chat models this server runs (memory only, no I/O): the picker, each reply's label, the card."""
    return {"chat_models": service().models}


def settings() -> Settings:
    return current_app.config["GLASSBOX"]


def owned_conversation(conversation_id: str) -> Conversation:
    conversation = service().conversation(owner_id(), conversation_id)
    if conversation is None:
        abort(404, "No such conversation.")
    return conversation


def owned_page(conversation_id: str | None) -> ChatPage:
    """The page of one of the browser's conversations (None: a new chat), read once (ChatService.page)."""
    page = service().page(owner_id(), conversation_id or None)
    if page is None:
        abort(404, "No such conversation.")
    return page


def owned_message(conversation_id: str, message_id: int) -> Message:
    owned_conversation(conversation_id)
    message = service().message(conversation_id, message_id)
    if message is None:
        abort(404, "No such message.")
    return message
