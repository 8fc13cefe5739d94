"""Conversations and messages in SQLite.  Every query is scoped by owner."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from webapp.db import Database

TITLE_CHARS = 60


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
            db.execute("INSERT INTO conversations VALUES (?, ?, ?, ?, ?)",
                       (conversation_id, owner, title, now, now))
        return conversation_id

    def delete_conversation(self, owner: str, conversation_id: str) -> bool:
        with self.db.connect() as db:
            deleted = db.execute("DELETE FROM conversations WHERE id = ? AND owner = ?",
                                 (conversation_id, owner)).rowcount
        return bool(deleted)

    # -- messages ----------------------------------------------------------------------------
    def messages(self, conversation_id: str) -> list[dict]:
        with self.db.connect() as db:
            rows = db.execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY id",
                              (conversation_id,)).fetchall()
        return [_message(r) for r in rows]

    def message(self, conversation_id: str, message_id: int) -> dict | None:
        with self.db.connect() as db:
            row = db.execute("SELECT * FROM messages WHERE id = ? AND conversation_id = ?",
                             (message_id, conversation_id)).fetchone()
        return _message(row) if row else None

    def add_message(self, conversation_id: str, role: str, content: str, *, status: str = "complete",
                    settings: dict | None = None) -> int:
        now = time.time()
        with self.db.connect() as db:
            cursor = db.execute(
                "INSERT INTO messages (conversation_id, role, content, status, settings, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, role, content, status, json.dumps(settings) if settings else None, now))
            db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id))
        return cursor.lastrowid

    def edit_message(self, conversation_id: str, message_id: int, content: str, keep: int = 0) -> None:
        """Replace a user message's text and drop every later turn (they answered the old text),
        except message `keep` (the reply to the new text, already queued)."""
        with self.db.connect() as db:
            db.execute("BEGIN")
            db.execute("UPDATE messages SET content = ? WHERE id = ? AND conversation_id = ?",
                       (content, message_id, conversation_id))
            db.execute("DELETE FROM messages WHERE conversation_id = ? AND id > ? AND id != ?",
                       (conversation_id, message_id, keep))
            db.execute("COMMIT")

    def delete_message(self, conversation_id: str, message_id: int) -> None:
        with self.db.connect() as db:
            db.execute("DELETE FROM messages WHERE id = ? AND conversation_id = ?", (message_id, conversation_id))

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
