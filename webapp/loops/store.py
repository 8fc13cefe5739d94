"""Saved Loop-lab traces: the final snapshot of a run, kept for the browser that made it."""

from __future__ import annotations

import json
import time
import uuid

from webapp.db import Database


class TraceStore:
    def __init__(self, db: Database) -> None:
        self.db = db

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
