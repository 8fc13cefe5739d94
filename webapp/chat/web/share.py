"""Read-only links to a conversation, made on purpose by its owner, revocable.

The conversation's own address stays private to the browser that made it; a shared link opens the branch
shown, read-only, for anyone on the intranet who has it (no editing, no new replies, no streams)."""

from __future__ import annotations

from flask import abort, redirect, render_template, url_for

from webapp.chat.web.blueprint import bp, owned_conversation, service
from webapp.web.security import owner_id


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
    found = service().shared(token)
    if found is None:
        abort(404, "This shared conversation does not exist, or its owner stopped sharing it.")
    conversation, messages = found
    return render_template("chat/shared.html", conversation=conversation, messages=messages, share_token=token)
