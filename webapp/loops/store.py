"""Saved Loop-lab traces: the final snapshot of a run, kept for the browser that made it."""

from __future__ import annotations

import json
import secrets
import time
import uuid

from webapp.db import Database


# Read-only links to a trace (Share): an unguessable token anyone may open, until its owner revokes it.
# Kept here rather than in schema.sql so the Loop lab's tables stay with the Loop lab.
SHARES = """CREATE TABLE IF NOT EXISTS trace_shares (
    token       TEXT PRIMARY KEY,
    trace_id    TEXT NOT NULL UNIQUE REFERENCES traces (id) ON DELETE CASCADE,
    created_at  REAL NOT NULL
)"""


class TraceStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        with self.db.connect() as conn:
            conn.execute(SHARES)

    def save(self, owner: str, snapshot: dict) -> str:
        trace_id = uuid.uuid4().hex[:16]
        with self.db.connect() as db:
            db.execute("INSERT INTO traces VALUES (?, ?, ?, ?)",
                       (trace_id, owner, json.dumps(snapshot), time.time()))
        return trace_id

    def get(self, owner: str, trace_id: str) -> dict | None:
        with self.db.connect() as db:
            row = db.execute("SELECT snapshot FROM traces WHERE id = ? AND owner = ?", (trace_id, owner)).fetchone()
        return json.loads(row["snapshot"]) if row else None

    def recent(self, owner: str, limit: int = 10) -> list[dict]:
        with self.db.connect() as db:
            rows = db.execute("SELECT id, snapshot, created_at FROM traces WHERE owner = ?"
                              " ORDER BY created_at DESC LIMIT ?", (owner, limit)).fetchall()
        out = []
        for row in rows:
            snapshot = json.loads(row["snapshot"])
            out.append({"id": row["id"], "created_at": row["created_at"], "source": snapshot.get("source"),
                        "request": snapshot["request"], "summary": snapshot.get("summary", {})})
        return out

    # -- sharing ---------------------------------------------------------------------------------
    def share(self, owner: str, trace_id: str) -> str | None:
        """The trace's read-only token, made on first use; None when the trace is not the owner's."""
        with self.db.connect() as db:
            if db.execute("SELECT 1 FROM traces WHERE id = ? AND owner = ?", (trace_id, owner)).fetchone() is None:
                return None
            token = secrets.token_urlsafe(18)  # 144 bits: not guessable, not derived from the id
            db.execute("INSERT OR IGNORE INTO trace_shares VALUES (?, ?, ?)", (token, trace_id, time.time()))
            return db.execute("SELECT token FROM trace_shares WHERE trace_id = ?", (trace_id,)).fetchone()["token"]

    def share_token(self, owner: str, trace_id: str) -> str | None:
        with self.db.connect() as db:
            row = db.execute("SELECT s.token FROM trace_shares s JOIN traces t ON t.id = s.trace_id"
                             " WHERE t.id = ? AND t.owner = ?", (trace_id, owner)).fetchone()
        return row["token"] if row else None

    def unshare(self, owner: str, trace_id: str) -> None:
        with self.db.connect() as db:
            db.execute("DELETE FROM trace_shares WHERE trace_id IN (SELECT id FROM traces WHERE id = ? AND owner = ?)",
                       (trace_id, owner))

    def shared(self, token: str) -> dict | None:
        with self.db.connect() as db:
            row = db.execute("SELECT t.snapshot FROM trace_shares s JOIN traces t ON t.id = s.trace_id"
                             " WHERE s.token = ?", (token,)).fetchone()
        return json.loads(row["snapshot"]) if row else None
