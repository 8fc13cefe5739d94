"""What the chat store hands out (webapp/chat/store.py): a message's status, what a turn saved, what a reply
saved beside its text and what other front ends asked of it, a chat page and the branch it shows; and how a
stored row reads back as them (a damaged column read as missing, never an error)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    """A message's status (messages.status). A StrEnum equals the string saved, so rows read back as
    plain strings compare equal to it, and SQL and templates keep the literal."""

    PENDING = "pending"  # a reply being written (or queued)
    COMPLETE = "complete"
    STOPPED = "stopped"
    ERROR = "error"


class ConversationFull(Exception):
    """begin_turn would take the conversation past its limit of messages (every version counts)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"This conversation has reached its limit of {limit} messages. Start a new chat. "
                         "Every version counts: regenerated replies, edited questions and branches too.")
        self.limit = limit


@dataclass(frozen=True)
class TurnIds:
    """What begin_turn saved, so that take_back_turn can undo it."""

    conversation_id: str
    created: bool
    shown: int | None  # the leaf shown before
    user_id: int | None
    reply_id: int
    title: str | None = None  # the title before, when the turn changed it (an edited first question)
    # What the page after the turn needs, read back by the writes themselves (ChatPage.after):
    kept: int = 0  # the conversation's messages before the turn
    saved: tuple[dict, ...] = ()  # the messages saved (the question, the reply), as read back
    conversation: dict | None = None  # the conversation after the turn


@dataclass(frozen=True)
class ReplyDetails:
    """What a reply saved beside its text (reply_details): its prompt (PromptReport.as_dict) and its odds, one
    row per token (TokenOdds.as_row). None: saved before they were kept, or damaged (not JSON, or not the
    shape written here: a disk or a hand that changed the row), and then named in `damaged`, which the
    views say instead of failing."""

    prompt: dict | None = None
    odds: list | None = None
    features: dict | None = None  # what the dictionaries read at each token (webapp/chat/decode/readings.py saved)
    damaged: tuple[str, ...] = ()  # "prompt", "odds", "features"


@dataclass(frozen=True)
class ReplySignals:
    """What other front ends asked about a pending reply (the reply_signals table)."""

    stop_requested: bool = False
    followed: bool = False


@dataclass
class ChatPage:
    """What a chat page shows, read at once (ChatStore.page): the conversation (None: a new chat), the
    owner's conversations newest first, every message of it by id and the leaf shown, its read-only link."""

    conversation: dict | None
    conversations: list[dict]
    tree: dict[int, dict]
    leaf: int | None
    share_token: str | None = None
    messages: list[dict] = dataclasses.field(init=False)  # the branch shown, oldest first (see branch)

    def __post_init__(self) -> None:
        self.messages = branch(self.tree, self.leaf)

    def after(self, turn: TurnIds) -> ChatPage | None:
        """The page once `turn` was saved, from what was read before and what the turn saved; None when
        the conversation changed between the two (another tab's turn): read it again then."""
        current = self.conversation is None if turn.created else (
            self.conversation is not None and self.conversation["id"] == turn.conversation_id
            and turn.shown == self.leaf and turn.kept == len(self.tree))
        if not current or turn.conversation is None or not turn.saved:
            return None
        conversation = turn.conversation
        others = [c for c in self.conversations if c["id"] != conversation["id"]]
        conversations = sorted([conversation, *others], key=lambda c: c["updated_at"], reverse=True)
        tree = {**self.tree, **{m["id"]: m for m in turn.saved}}
        return ChatPage(conversation, conversations, tree, turn.reply_id, self.share_token)


def branch(everything: dict[int, dict], leaf: int | None) -> list[dict]:
    """The branch that ends at `leaf`, oldest first; each message says which version of its place it is."""
    path, node = [], everything.get(leaf) if leaf is not None else None
    while node is not None:
        path.append(node)
        node = everything.get(node["parent_id"])
    path.reverse()
    siblings: dict = {}
    for m in everything.values():
        siblings.setdefault((m["parent_id"], m["role"]), []).append(m["id"])
    for m in path:
        m["versions"] = siblings[(m["parent_id"], m["role"])]
        m["version"] = m["versions"].index(m["id"]) + 1
    return path


def details_from_row(row) -> ReplyDetails:
    read: dict = {}
    damaged = []
    for field, kind in (("prompt", dict), ("odds", list), ("features", dict)):
        if row is None or field not in row.keys() or not row[field]:
            continue
        try:
            value = json.loads(row[field])
        except ValueError:
            value = None
        if isinstance(value, kind):
            read[field] = value
        else:
            damaged.append(field)
    return ReplyDetails(**read, damaged=tuple(damaged))


def message_from_row(row) -> dict:
    message = dict(row)
    message["settings"] = json.loads(message["settings"]) if message["settings"] else None
    # what an ablated version switched off (webapp/chat/ablation.py); None for every other message
    message["intervention"] = _json_or_none(message.get("intervention"))
    return message


def _json_or_none(text: str | None) -> dict | None:
    """A JSON object column; None when empty or damaged (the page then shows the version unlabelled)."""
    try:
        found = json.loads(text) if text else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
