"""Conversations and messages in SQLite.  Every query is scoped by owner."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from webapp.db import Database

TITLE_CHARS = 60
ROOT = 0  # show_message(ROOT): show nothing yet, so the next message starts a new first version


@dataclass(frozen=True)
class ReplyStats:
    tokens: int | None = None
    ttft_seconds: float | None = None
    tokens_per_second: float | None = None


class ChatStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- conversations -----------------------------------------------------------------------
    def conversations(self, owner: str) -> list[dict]:
        with self.db.connect() as db:
            rows = db.execute("SELECT * FROM conversations WHERE owner = ? ORDER BY updated_at DESC",
                              (owner,)).fetchall()
        return [dict(r) for r in rows]

    def conversation(self, owner: str, conversation_id: str) -> dict | None:
        with self.db.connect() as db:
            row = db.execute("SELECT * FROM conversations WHERE id = ? AND owner = ?",
                             (conversation_id, owner)).fetchone()
        return dict(row) if row else None

    def create_conversation(self, owner: str, first_message: str) -> str:
        title = " ".join(first_message.split())[:TITLE_CHARS] or "New chat"
        conversation_id, now = uuid.uuid4().hex[:16], time.time()
        with self.db.connect() as db:
            db.execute("INSERT INTO conversations (id, owner, title, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
                       (conversation_id, owner, title, now, now))
        return conversation_id

    def delete_conversation(self, owner: str, conversation_id: str) -> bool:
        with self.db.connect() as db:
            deleted = db.execute("DELETE FROM conversations WHERE id = ? AND owner = ?",
                                 (conversation_id, owner)).rowcount
        return bool(deleted)

    # -- messages ----------------------------------------------------------------------------
    # A conversation's messages form a tree: a regenerated reply, an edited question or a branch from a
    # token is a new version beside the old one (the same parent). One branch is shown: the path from
    # the first message to the conversation's leaf.
    def messages(self, conversation_id: str) -> list[dict]:
        """The branch shown, oldest first; each message says which version of its place it is."""
        everything, leaf = self._tree(conversation_id)
        path, node = [], everything.get(leaf)
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

    def all_messages(self, conversation_id: str) -> list[dict]:
        """Every version of every message (each with its parent_id), oldest first."""
        return list(self._tree(conversation_id)[0].values())

    def _tree(self, conversation_id: str) -> tuple[dict, int | None]:
        with self.db.connect() as db:
            rows = db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id",
                              (conversation_id,)).fetchall()
            leaf = db.execute("SELECT leaf_id FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return {r["id"]: _message(r) for r in rows}, (leaf[0] if leaf else None)

    def message(self, conversation_id: str, message_id: int) -> dict | None:
        with self.db.connect() as db:
            row = db.execute("SELECT * FROM messages WHERE id = ? AND conversation_id = ?",
                             (message_id, conversation_id)).fetchone()
        return _message(row) if row else None

    def leaf(self, conversation_id: str) -> int | None:
        with self.db.connect() as db:
            row = db.execute("SELECT leaf_id FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return row[0] if row else None

    def add_message(self, conversation_id: str, role: str, content: str, *, status: str = "complete",
                    settings: dict | None = None, parent_id: int | None = None, after_leaf: bool = True) -> int:
        """A new message, shown from now on: after the shown branch's last message (after_leaf), or as a
        new version beside the messages whose parent is `parent_id`."""
        now = time.time()
        with self.db.connect() as db:
            db.execute("BEGIN")
            if after_leaf:
                parent_id = db.execute("SELECT leaf_id FROM conversations WHERE id = ?", (conversation_id,)).fetchone()[0]
            cursor = db.execute(
                "INSERT INTO messages (conversation_id, role, content, status, settings, created_at, parent_id)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, role, content, status, json.dumps(settings) if settings else None, now, parent_id))
            db.execute("UPDATE conversations SET updated_at = ?, leaf_id = ? WHERE id = ?",
                       (now, cursor.lastrowid, conversation_id))
            db.execute("COMMIT")
        return cursor.lastrowid

    def set_title(self, conversation_id: str, title: str) -> None:
        with self.db.connect() as db:
            db.execute("UPDATE conversations SET title = ? WHERE id = ?",
                       (" ".join(title.split())[:TITLE_CHARS] or "New chat", conversation_id))

    def show_message(self, conversation_id: str, message_id: int | None, descend: bool = True) -> None:
        """Show the branch through a message: down to its newest descendant, newest child at each step
        (descend=False: end the branch shown at the message itself; ROOT or None: show nothing, so the
        next message added starts a new first version)."""
        with self.db.connect() as db:
            node = message_id or None
            while descend and node and (child := db.execute("SELECT MAX(id) FROM messages WHERE parent_id = ?",
                                                (node,)).fetchone()[0]):
                node = child
            db.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?", (node, conversation_id))

    def delete_message(self, conversation_id: str, message_id: int, show: int | None = None) -> None:
        """Delete a message (and what follows it); then show `show`, else the deleted one's parent."""
        with self.db.connect() as db:
            db.execute("BEGIN")
            row = db.execute("SELECT parent_id FROM messages WHERE id = ? AND conversation_id = ?",
                             (message_id, conversation_id)).fetchone()
            db.execute("DELETE FROM messages WHERE id = ? AND conversation_id = ?", (message_id, conversation_id))
            if row is not None:
                db.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?",
                           (show if show is not None else row[0], conversation_id))
            db.execute("COMMIT")

    def finish_reply(self, message_id: int, content: str, status: str, error: str | None,
                     stats: ReplyStats, odds: list | None = None) -> None:
        """The reply's text, outcome and figures; `odds`: one compact row per token (TokenOdds.as_row)."""
        with self.db.connect() as db:
            db.execute("BEGIN")
            db.execute("UPDATE messages SET content = ?, status = ?, error = ?, tokens = ?, ttft_seconds = ?,"
                       " tokens_per_second = ? WHERE id = ?",
                       (content, status, error, stats.tokens, stats.ttft_seconds, stats.tokens_per_second,
                        message_id))
            if odds is not None:
                db.execute("UPDATE reply_details SET odds = ? WHERE message_id = ?",
                           (json.dumps(odds, separators=(",", ":")), message_id))
            db.execute("COMMIT")

    def save_progress(self, message_id: int, content: str) -> None:
        """A running reply's text so far (one UPDATE), so a crash keeps what the user saw."""
        with self.db.connect() as db:
            db.execute("UPDATE messages SET content = ? WHERE id = ? AND status = 'pending'", (content, message_id))

    def save_prompt(self, message_id: int, prompt: dict) -> None:
        """The exact prompt a reply is given (PromptReport.as_dict), saved with the pending reply."""
        with self.db.connect() as db:
            db.execute("INSERT OR REPLACE INTO reply_details (message_id, prompt) VALUES (?, ?)",
                       (message_id, json.dumps(prompt, separators=(",", ":"))))

    def details(self, message_id: int) -> dict:
        """{"prompt": dict or None, "odds": list or None} of a reply (None: saved before they were kept)."""
        with self.db.connect() as db:
            row = db.execute("SELECT prompt, odds FROM reply_details WHERE message_id = ?", (message_id,)).fetchone()
        if row is None:
            return {"prompt": None, "odds": None}
        return {k: json.loads(row[k]) if row[k] else None for k in ("prompt", "odds")}


def _message(row) -> dict:
    message = dict(row)
    message["settings"] = json.loads(message["settings"]) if message["settings"] else None
    return message
