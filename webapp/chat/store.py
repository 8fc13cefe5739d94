"""Conversations and messages, in SQLite or PostgreSQL (webapp/db).  Every query is scoped by owner."""

from __future__ import annotations

import json
import secrets
import time
import uuid
from typing import Any

from webapp.chat.decode.types import ReplyStats
from webapp.chat.records import (
    ChatPage,
    Conversation,
    ConversationFull,
    Message,
    ReplyDetails,
    ReplyProgress,
    ReplySignals,
    SavedReadings,
    Status,
    TurnIds,
    branch,
    details_from_row,
)
from webapp.chat.registry import ModelRecord
from webapp.db import AnyDatabase, in_batches

TITLE_CHARS = 60
ROOT = 0  # begin_turn(branch_from=ROOT): a new version of the first message (it has no parent)
DELETE_BATCH = 500  # messages deleted per write transaction (see delete_conversation)
# A conversation being deleted belongs to no browser: its owner is prefixed with this (a session's
# owner is URL-safe base64 and an API owner starts "api:", so neither ever starts with it).
DELETING = "deleting:"
# A pending reply belongs to the front end that runs it (messages.runner) until its lease runs out; each
# save of its progress (every second or so while it is written) renews it, and so does the chat service
# every LEASE_RENEW_SECONDS for every reply it still runs or has queued (webapp/chat/service.py). A front
# end that starts stops its own pending replies (it died) and those of others whose lease ran out, never a
# running one; a stream following a reply from another front end ends it as stopped once its lease ran
# out (webapp/chat/follow.py), so within this long of its front end dying.
REPLY_LEASE_SECONDS = 15.0
LEASE_RENEW_SECONDS = 5.0


class ChatStore:
    def __init__(self, db: AnyDatabase) -> None:
        self.db = db

    # -- conversations -----------------------------------------------------------------------
    def conversations(self, owner: str) -> list[Conversation]:
        with self.db.connect() as db:
            rows = db.execute("SELECT * FROM conversations WHERE owner = ? ORDER BY updated_at DESC",
                              (owner,)).fetchall()
        return [Conversation.from_row(r) for r in rows]

    def conversation(self, owner: str, conversation_id: str) -> Conversation | None:
        with self.db.connect() as db:
            row = db.execute("SELECT * FROM conversations WHERE id = ? AND owner = ?",
                             (conversation_id, owner)).fetchone()
        return Conversation.from_row(row) if row else None

    def delete_conversation(self, owner: str, conversation_id: str) -> bool:
        """Delete a conversation and everything in it -> whether it was the owner's. It is gone for its
        owner and its read-only link at once; its rows then go DELETE_BATCH at a time, each batch a
        transaction of its own, so a large conversation never holds the write lock for long."""
        with self.db.transaction() as db:
            hidden = db.execute("UPDATE conversations SET owner = ? || owner WHERE id = ? AND owner = ?",
                                (DELETING, conversation_id, owner)).rowcount
            db.execute("DELETE FROM conversation_shares WHERE conversation_id = ?", (conversation_id,))
            # its follow links too (webapp/present.py): their followers' streams end at their next read
            db.execute("DELETE FROM present_links WHERE kind = 'chat' AND target = ?", (conversation_id,))
        if hidden:
            self._delete_rows(conversation_id)
        return bool(hidden)

    def finish_deletions(self) -> int:
        """Delete what a deletion left when the process stopped halfway -> conversations deleted."""
        with self.db.connect() as db:
            left = [r[0] for r in db.execute("SELECT id FROM conversations WHERE substr(owner, 1, ?) = ?",
                                             (len(DELETING), DELETING))]
        for conversation_id in left:
            self._delete_rows(conversation_id)
        return len(left)

    def _delete_rows(self, conversation_id: str) -> None:
        # Newest first: a message's replies and versions are newer than it, so none is left pointing at
        # a deleted parent, and each batch's cascade (reply_details, children by parent_id) stays small.
        # (A cascade's rows make rowcount unreliable here: whether any are left is asked instead.)
        while True:
            with self.db.transaction() as db:
                db.execute("DELETE FROM messages WHERE id IN (SELECT id FROM messages WHERE conversation_id = ?"
                           " ORDER BY id DESC LIMIT ?)", (conversation_id, DELETE_BATCH))
                if db.execute("SELECT 1 FROM messages WHERE conversation_id = ? LIMIT 1",
                              (conversation_id,)).fetchone() is None:
                    db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
                    return

    # -- messages ----------------------------------------------------------------------------
    # A conversation's messages form a tree: a regenerated reply, an edited question or a branch from a
    # token is a new version beside the old one (the same parent). One branch is shown: the path from
    # the first message to the conversation's leaf.
    def messages(self, conversation_id: str) -> list[Message]:
        """The branch shown, oldest first; each message says which version of its place it is."""
        return branch(*self._tree(conversation_id))

    def all_messages(self, conversation_id: str) -> list[Message]:
        """Every version of every message (each with its parent_id), oldest first."""
        return list(self._tree(conversation_id)[0].values())

    def _tree(self, conversation_id: str, db: Any = None) -> tuple[dict[int, Message], int | None]:
        """Every message of a conversation by id, and the leaf shown: one statement, so the leaf is one of
        the rows read, whatever commits meanwhile (no conversation, or no message: no leaf)."""
        if db is None:
            with self.db.connect() as db:
                return self._tree(conversation_id, db)
        rows = db.execute("SELECT *, (SELECT leaf_id FROM conversations WHERE id = ?) AS shown_leaf FROM messages"
                          " WHERE conversation_id = ? ORDER BY id", (conversation_id, conversation_id)).fetchall()
        everything = {r["id"]: Message.from_row(r) for r in rows}
        return everything, rows[-1]["shown_leaf"] if rows else None

    def page(self, owner: str, conversation_id: str | None) -> ChatPage | None:
        """What a chat page shows, in two statements: the owner's conversations (the one shown with its
        read-only link, if shared) and the shown one's messages -> None when it is not the owner's."""
        with self.db.connect() as db:
            rows = db.execute("SELECT c.*, s.token AS share_token FROM conversations c LEFT JOIN conversation_shares s"
                              " ON s.conversation_id = c.id AND c.id = ? WHERE c.owner = ? ORDER BY c.updated_at DESC",
                              (conversation_id, owner)).fetchall()
            conversations = [Conversation.from_row(r) for r in rows]
            shown = next((c for c in conversations if c.id == conversation_id), None)
            if conversation_id is not None and shown is None:
                return None
            tree, leaf = self._tree(shown.id, db) if shown else ({}, None)
        token = next(r["share_token"] for r in rows if r["id"] == conversation_id) if shown else None
        return ChatPage(shown, conversations, tree, leaf, token)

    def message(self, conversation_id: str, message_id: int) -> Message | None:
        with self.db.connect() as db:
            row = db.execute("SELECT * FROM messages WHERE id = ? AND conversation_id = ?",
                             (message_id, conversation_id)).fetchone()
        return Message.from_row(row) if row else None

    def show_message(self, conversation_id: str, message_id: int) -> None:
        """Show the branch through a message: down to its newest descendant, newest child at each step."""
        with self.db.transaction() as db:
            node = message_id
            while node and (child := db.execute("SELECT MAX(id) FROM messages WHERE parent_id = ?",
                                                (node,)).fetchone()[0]):
                node = child
            db.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?", (node, conversation_id))

    # -- read-only links ------------------------------------------------------------------------
    def share_conversation(self, owner: str, conversation_id: str) -> str | None:
        """The conversation's read-only token (made once; None if it is not the owner's)."""
        with self.db.transaction() as db:
            owned = db.execute("SELECT 1 FROM conversations WHERE id = ? AND owner = ?",
                               (conversation_id, owner)).fetchone()
            if owned is None:
                return None
            db.execute("INSERT INTO conversation_shares VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                       (secrets.token_urlsafe(18), conversation_id, time.time()))  # 144 random bits
        return self.conversation_share(owner, conversation_id)

    def conversation_share(self, owner: str, conversation_id: str) -> str | None:
        with self.db.connect() as db:
            found = db.execute("SELECT token FROM conversation_shares JOIN conversations c ON c.id = conversation_id"
                               " WHERE conversation_id = ? AND c.owner = ?", (conversation_id, owner)).fetchone()
        return found[0] if found else None

    def stop_sharing(self, owner: str, conversation_id: str) -> None:
        with self.db.transaction() as db:
            db.execute("DELETE FROM conversation_shares WHERE conversation_id IN"
                       " (SELECT id FROM conversations WHERE id = ? AND owner = ?)", (conversation_id, owner))

    def shared_conversation(self, token: str) -> Conversation | None:
        """The conversation a token opens (None once its owner stopped sharing it)."""
        with self.db.connect() as db:
            found = db.execute("SELECT c.* FROM conversation_shares s JOIN conversations c ON c.id = s.conversation_id"
                               " WHERE s.token = ?", (token,)).fetchone()
        return Conversation.from_row(found) if found else None

    def set_token_view(self, conversation_id: str, message_id: int, on: bool) -> None:
        with self.db.transaction() as db:
            db.execute("UPDATE messages SET token_view = ? WHERE id = ? AND conversation_id = ?",
                       (int(on), message_id, conversation_id))

    def finish_reply(self, message_id: int, content: str, status: Status, error: str | None,
                     stats: ReplyStats, odds: list[list[Any]] | None = None,
                     features: dict[str, Any] | None = None) -> None:
        """The reply's text, outcome and figures; `odds`: one compact row per token (TokenOdds.as_row);
        `features`: what the dictionaries read at each token (webapp/chat/decode/readings.py saved)."""
        with self.db.transaction() as db:
            db.execute("UPDATE messages SET content = ?, status = ?, error = ?, tokens = ?, ttft_seconds = ?,"
                       " tokens_per_second = ?, wait_seconds = ? WHERE id = ?",
                       (content, status, error, stats.tokens, stats.ttft_seconds, stats.tokens_per_second,
                        stats.wait_seconds, message_id))
            if odds is not None:
                db.execute("UPDATE reply_details SET odds = ? WHERE message_id = ?",
                           (json.dumps(odds, separators=(",", ":")), message_id))
            if features is not None:
                db.execute("UPDATE reply_details SET features = ? WHERE message_id = ?",
                           (json.dumps(features, separators=(",", ":")), message_id))

    def begin_turn(self, owner: str, conversation_id: str | None, *, user_text: str | None,
                   branch_from: int | None, settings: dict[str, Any], prompt: dict[str, Any], max_messages: int = 0,
                   model: ModelRecord | None = None, intervention: dict[str, Any] | None = None) -> TurnIds:
        """Save what a new reply needs, in one transaction: its conversation (when new), the question
        (when there is one), the pending reply and its prompt. The reply follows the branch shown, or
        is a new version after `branch_from` (ROOT: a new first message). Both are shown from now on.
        Raises ConversationFull when the conversation would keep more than `max_messages` messages,
        every version counted (0: no limit); checked under the write lock, so no two turns pass it at once."""
        now = time.time()
        adding = 1 if user_text is None else 2
        with self.db.transaction() as db:
            created = conversation_id is None
            kept, shown, title = 0, None, None  # its messages, the leaf shown, its title (one statement)
            if not created:
                kept, shown, title = db.execute(
                    "SELECT (SELECT COUNT(*) FROM messages WHERE conversation_id = c.id), leaf_id, title"
                    " FROM conversations c WHERE id = ?", (conversation_id,)).fetchone()
            if max_messages and kept + adding > max_messages:
                raise ConversationFull(max_messages)
            if created:
                conversation_id = uuid.uuid4().hex[:16]
                db.execute("INSERT INTO conversations (id, owner, title, created_at, updated_at, model)"
                           " VALUES (?, ?, ?, ?, ?, ?)",
                           (conversation_id, owner, _title(user_text or ""), now, now, model and model.name))
            if branch_from == ROOT and user_text is not None and not created:  # the first question, edited
                db.execute("UPDATE conversations SET title = ? WHERE id = ?", (_title(user_text), conversation_id))
            else:
                title = None
            parent = shown if branch_from is None else (branch_from or None)
            saved: list[Message] = []
            user_id = None
            if user_text is not None:
                saved.append(Message.from_row(db.execute(
                    "INSERT INTO messages (conversation_id, role, content, status, created_at,"
                    " parent_id) VALUES (?, 'user', ?, 'complete', ?, ?) RETURNING *",
                    (conversation_id, user_text, now, parent)).fetchone()))
                parent = user_id = saved[-1].id
            saved.append(Message.from_row(db.execute(
                "INSERT INTO messages (conversation_id, role, content, status, settings, created_at,"
                " parent_id, runner, lease_until, model, model_file, model_precision, intervention)"
                " VALUES (?, 'assistant', '', 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING *",
                (conversation_id, json.dumps(settings), now, parent, self.db.runner, now + REPLY_LEASE_SECONDS,
                 model and model.name, model and model.file_id, model and model.precision,
                 None if intervention is None else json.dumps(intervention))).fetchone()))
            reply_id = saved[-1].id
            db.execute("INSERT INTO reply_details (message_id, prompt) VALUES (?, ?)",
                       (reply_id, json.dumps(prompt, separators=(",", ":"))))
            conversation = Conversation.from_row(db.execute(
                "UPDATE conversations SET updated_at = ?, leaf_id = ? WHERE id = ? RETURNING *",
                (now, reply_id, conversation_id)).fetchone())
        assert conversation_id is not None and reply_id is not None  # made above when not given
        return TurnIds(conversation_id, created, shown, user_id, reply_id, title, kept, tuple(saved), conversation)

    def take_back_turn(self, owner: str, turn: TurnIds) -> None:
        """Undo begin_turn, in one transaction: the branch shown is the one shown before."""
        with self.db.transaction() as db:
            if turn.created:
                db.execute("DELETE FROM conversations WHERE id = ? AND owner = ?", (turn.conversation_id, owner))
            else:
                db.execute("DELETE FROM messages WHERE id IN (?, ?)", (turn.reply_id, turn.user_id or -1))
                db.execute("UPDATE conversations SET leaf_id = ?, title = COALESCE(?, title) WHERE id = ?",
                           (turn.shown, turn.title, turn.conversation_id))

    def save_progress(self, message_id: int, content: str) -> ReplySignals:
        """A running reply's text so far, so a crash keeps what the user saw; renews its lease -> what other
        front ends asked about it meanwhile (read in the same transaction: one round trip per save)."""
        with self.db.transaction() as db:
            db.execute("UPDATE messages SET content = ?, lease_until = ? WHERE id = ? AND status = 'pending'",
                       (content, time.time() + REPLY_LEASE_SECONDS, message_id))
            row = db.execute("SELECT stop_requested, followed FROM reply_signals WHERE message_id = ?",
                             (message_id,)).fetchone()
        return ReplySignals(bool(row[0]), bool(row[1])) if row else ReplySignals()

    def renew_leases(self, message_ids: list[int]) -> dict[int, ReplySignals]:
        """This front end still runs these replies (queued ones too, which save nothing yet): their leases
        hold -> what other front ends asked about them meanwhile (those with a request only)."""
        if not message_ids:
            return {}
        marks = ", ".join("?" * len(message_ids))
        with self.db.transaction() as db:
            db.execute(f"UPDATE messages SET lease_until = ? WHERE id IN ({marks}) AND status = 'pending'"
                       " AND runner = ?", (time.time() + REPLY_LEASE_SECONDS, *message_ids, self.db.runner))
            rows = db.execute(f"SELECT message_id, stop_requested, followed FROM reply_signals"
                              f" WHERE message_id IN ({marks})", tuple(message_ids)).fetchall()
        return {row[0]: ReplySignals(bool(row[1]), bool(row[2])) for row in rows}

    def request_stop(self, message_id: int) -> None:
        """Stop pressed on a front end that does not run the reply: the one that does reads it as it saves."""
        self._signal(message_id, "stop_requested")

    def mark_followed(self, message_id: int) -> None:
        """The reply's stream is followed on a front end that does not run it: not an orphan."""
        self._signal(message_id, "followed")

    def _signal(self, message_id: int, column: str) -> None:
        with self.db.transaction() as db:
            db.execute(f"INSERT INTO reply_signals (message_id, {column}) SELECT id, 1 FROM messages"
                       f" WHERE id = ? AND status = 'pending'"
                       f" ON CONFLICT (message_id) DO UPDATE SET {column} = 1", (message_id,))

    def reply_progress(self, message_id: int) -> ReplyProgress | None:
        """A reply's text and status as saved, for a stream that follows it from another front end."""
        with self.db.connect() as db:
            row = db.execute("SELECT content, status, lease_until FROM messages WHERE id = ?",
                             (message_id,)).fetchone()
        if row is None:
            return None
        lease = row["lease_until"]
        return ReplyProgress(row["content"], Status(row["status"]),
                             row["status"] == Status.PENDING and lease is not None and lease < time.time())

    def stop_abandoned(self, message_id: int) -> None:
        """A pending reply whose front end died (its lease ran out): it will never end, so it ends as stopped."""
        with self.db.transaction() as db:
            db.execute("UPDATE messages SET status = 'stopped' WHERE id = ? AND status = 'pending'"
                       " AND lease_until < ?", (message_id, time.time()))

    def details(self, message_id: int) -> ReplyDetails:
        """What a reply saved beside its text (ReplyDetails)."""
        with self.db.connect() as db:
            row = db.execute("SELECT prompt, odds, features FROM reply_details WHERE message_id = ?",
                             (message_id,)).fetchone()
        return details_from_row(row)

    def saved_features(self, owner: str, model: str, limit: int) -> list[SavedReadings]:
        """The owner's newest `limit` replies by `model` that kept their features, newest first."""
        with self.db.connect() as db:
            return [SavedReadings(r["id"], r["conversation_id"], r["title"], r["features"]) for r in db.execute(
                "SELECT m.id, m.conversation_id, c.title, d.features FROM messages m"
                " JOIN conversations c ON c.id = m.conversation_id JOIN reply_details d ON d.message_id = m.id"
                " WHERE c.owner = ? AND m.model = ? AND d.features IS NOT NULL ORDER BY m.id DESC LIMIT ?",
                (owner, model, limit)).fetchall()]

    def details_of(self, message_ids: list[int]) -> dict[int, ReplyDetails]:
        """details() of several replies, read in one statement, without their features (the pages that show many
        replies never show those)."""
        if not message_ids:
            return {}
        marks = ", ".join("?" * len(message_ids))
        with self.db.connect() as db:
            rows = {r["message_id"]: r for r in db.execute(
                f"SELECT message_id, prompt, odds FROM reply_details WHERE message_id IN ({marks})",
                tuple(message_ids)).fetchall()}
        return {message_id: details_from_row(rows.get(message_id)) for message_id in message_ids}


    # -- what the quotas and the retention ask (OwnerStore, webapp/browsers.py) -----------------------
    def stored_bytes(self, *owners: str) -> int:
        """Characters these owners keep in messages and reply details, together."""
        total = 0
        with self.db.connect() as db:
            for marks, batch in in_batches(owners):
                total += int(db.execute(
                    "SELECT COALESCE(SUM(LENGTH(m.content) + COALESCE(LENGTH(d.prompt), 0)"
                    " + COALESCE(LENGTH(d.odds), 0) + COALESCE(LENGTH(d.features), 0)), 0)"
                    " FROM conversations c JOIN messages m ON m.conversation_id = c.id"
                    f" LEFT JOIN reply_details d ON d.message_id = m.id WHERE c.owner IN ({marks})",
                    batch).fetchone()[0])
        return total

    def forget_owner(self, owner: str) -> int:
        """Delete every conversation of `owner`, each as delete_conversation does -> how many."""
        return sum(self.delete_conversation(owner, c.id) for c in self.conversations(owner))

    def count_conversations(self, owner: str) -> int:
        with self.db.connect() as db:
            return int(db.execute("SELECT COUNT(*) FROM conversations WHERE owner = ?", (owner,)).fetchone()[0])


def _title(text: str) -> str:
    return " ".join(text.split())[:TITLE_CHARS] or "New chat"
