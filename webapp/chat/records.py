"""What the chat store hands out (webapp/chat/store.py), as frozen records made from its rows here and nowhere
else: a conversation, a message and its status, what a turn saved, what a reply saved beside its text and what
other front ends asked of it, a chat page and the branch it shows (a damaged column reads as missing, never an
error)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from webapp.chat import interventions


class Status(StrEnum):
    """A message's status (messages.status). A StrEnum equals the string saved, so rows read back as
    plain strings compare equal to it, and SQL and templates keep the literal."""

    PENDING = "pending"  # a reply being written (or queued)
    COMPLETE = "complete"
    STOPPED = "stopped"
    ERROR = "error"


@dataclass(frozen=True)
class Conversation:
    """A row of `conversations`: its fields are the columns, in their order (export.json lists them so)."""

    id: str
    owner: str
    title: str
    created_at: float
    updated_at: float
    leaf_id: int | None  # the newest message of the branch shown
    model: str | None  # the model its new replies use (None: saved before conversations kept one)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Conversation:
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls)})

    def as_dict(self) -> dict[str, Any]:
        """The row as export.json shows it."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Message:
    """A row of `messages`: its fields are the columns, in their order (export.json lists them so), with the
    JSON columns read; on the branch shown (see `branch`) also every version of its place and which it is."""

    id: int
    conversation_id: str
    role: str  # "user" | "assistant"
    content: str
    status: Status
    error: str | None
    settings: dict[str, Any] | None  # a reply's sampling settings (SamplingParams.as_dict and where it branched)
    tokens: int | None
    ttft_seconds: float | None
    tokens_per_second: float | None
    wait_seconds: float | None
    created_at: float
    parent_id: int | None
    token_view: int  # 1: its owner reads it as its tokens
    runner: str | None  # the front end that runs it while pending
    lease_until: float | None
    model: str | None  # the model that wrote a reply (webapp/chat/registry.py model_record)
    model_file: str | None
    model_precision: str | None
    # what a version changed in the model, as saved (webapp/chat/interventions.py reads it); None: the model's own
    intervention: dict[str, Any] | None
    versions: tuple[int, ...] | None = None  # on the branch shown: the ids of its place's versions, oldest first
    version: int | None = None  # ... and which of them it is, from 1

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Message:
        found = {f.name: row[f.name] for f in COLUMNS}
        # a status this code does not know (a hand, or a newer front end on a shared database) reads as an error
        found["status"] = Status(found["status"]) if found["status"] in STATUSES else Status.ERROR
        found["settings"] = _json_or_none(found["settings"])
        found["intervention"] = _json_or_none(found["intervention"])
        return cls(**found)

    @property
    def change(self) -> interventions.Intervention | None:
        """What this version changed in the model, read as a tagged union (webapp/chat/interventions.py); None:
        the model's own run. Raises ValueError for a record this code did not write."""
        return interventions.from_record(self.intervention)

    @property
    def is_reply(self) -> bool:
        return self.role == "assistant"

    @property
    def pending(self) -> bool:
        return self.status == Status.PENDING

    @property
    def said(self) -> bool:
        """Part of what the next reply is given: a question, or a reply that finished or was stopped."""
        return self.role == "user" or self.status in (Status.COMPLETE, Status.STOPPED)

    @property
    def turn(self) -> dict[str, str]:
        """As a prompt takes it (PromptBuilder.explain)."""
        return {"role": self.role, "content": self.content}

    def as_dict(self) -> dict[str, Any]:
        """The row as export.json shows it: every column, then the versions when it is on the branch shown."""
        found = {f.name: getattr(self, f.name) for f in COLUMNS}
        if self.versions is not None:
            found.update(versions=list(self.versions), version=self.version)
        return found


COLUMNS = tuple(f for f in dataclasses.fields(Message) if f.name not in ("versions", "version"))
STATUSES = frozenset(s.value for s in Status)


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
    saved: tuple[Message, ...] = ()  # the messages saved (the question, the reply), as read back
    conversation: Conversation | None = None  # the conversation after the turn


@dataclass(frozen=True)
class ReplyDetails:
    """What a reply saved beside its text (reply_details): its prompt (PromptReport.as_dict) and its odds, one
    row per token (TokenOdds.as_row). None: saved before they were kept, or damaged (not JSON, or not the
    shape written here: a disk or a hand that changed the row), and then named in `damaged`, which the
    views say instead of failing."""

    prompt: dict[str, Any] | None = None
    odds: list[list[Any]] | None = None
    features: dict[str, Any] | None = None  # what the dictionaries read at each token (decode/readings.py saved)
    damaged: tuple[str, ...] = ()  # "prompt", "odds", "features"


@dataclass(frozen=True)
class ReplySignals:
    """What other front ends asked about a pending reply (the reply_signals table)."""

    stop_requested: bool = False
    followed: bool = False


@dataclass(frozen=True)
class ReplyProgress:
    """A reply's text and status as saved (ChatStore.reply_progress)."""

    content: str
    status: Status
    abandoned: bool  # still pending, but the lease of the front end that ran it ran out (it died)


@dataclass(frozen=True)
class SavedReadings:
    """A reply that kept its features (ChatStore.saved_features)."""

    message_id: int
    conversation_id: str
    title: str  # its conversation's
    features: str  # the reply_details column, JSON text (webapp/chat/decode/readings.py saved_reading reads it)


@dataclass
class ChatPage:
    """What a chat page shows, read at once (ChatStore.page): the conversation (None: a new chat), the
    owner's conversations newest first, every message of it by id and the leaf shown, its read-only link."""

    conversation: Conversation | None
    conversations: list[Conversation]
    tree: dict[int, Message]
    leaf: int | None
    share_token: str | None = None
    messages: list[Message] = dataclasses.field(init=False)  # the branch shown, oldest first (see branch)

    def __post_init__(self) -> None:
        self.messages = branch(self.tree, self.leaf)

    def after(self, turn: TurnIds) -> ChatPage | None:
        """The page once `turn` was saved, from what was read before and what the turn saved; None when
        the conversation changed between the two (another tab's turn): read it again then."""
        current = self.conversation is None if turn.created else (
            self.conversation is not None and self.conversation.id == turn.conversation_id
            and turn.shown == self.leaf and turn.kept == len(self.tree))
        if not current or turn.conversation is None or not turn.saved:
            return None
        conversation = turn.conversation
        others = [c for c in self.conversations if c.id != conversation.id]
        conversations = sorted([conversation, *others], key=lambda c: c.updated_at, reverse=True)
        tree = {**self.tree, **{m.id: m for m in turn.saved}}
        return ChatPage(conversation, conversations, tree, turn.reply_id, self.share_token)


def branch(everything: dict[int, Message], leaf: int | None) -> list[Message]:
    """The branch that ends at `leaf`, oldest first, each message with which version of its place it is."""
    path, node = [], everything.get(leaf) if leaf is not None else None
    while node is not None:
        path.append(node)
        node = everything.get(node.parent_id) if node.parent_id is not None else None
    path.reverse()
    siblings: dict[tuple[int | None, str], list[int]] = {}
    for m in everything.values():
        siblings.setdefault((m.parent_id, m.role), []).append(m.id)
    shown = []
    for m in path:
        versions = tuple(siblings[(m.parent_id, m.role)])
        shown.append(dataclasses.replace(m, versions=versions, version=versions.index(m.id) + 1))
    return shown


def details_from_row(row: Mapping[str, Any] | None) -> ReplyDetails:
    read: dict[str, Any] = {}
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


def _json_or_none(text: str | None) -> dict[str, Any] | None:
    """A JSON object column; None when empty or damaged (the page then shows the version unlabelled)."""
    try:
        found = json.loads(text) if text else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
