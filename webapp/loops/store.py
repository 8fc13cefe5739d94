"""Saved Loop-lab traces: the final snapshot of a run, kept for the browser that made it."""

from __future__ import annotations

import json
import secrets
import time
import uuid

from webapp.db import AnyDatabase, in_batches

SWEEP_PREFIX = '{"sweep": '  # how json.dumps begins a sweep's snapshot


def is_sweep(snapshot: dict | None) -> bool:
    return isinstance(snapshot, dict) and "sweep" in snapshot


class TraceStore:
    def __init__(self, db: AnyDatabase) -> None:
        self.db = db

    def save(self, owner: str, snapshot: dict) -> str:
        trace_id = uuid.uuid4().hex[:16]
        with self.db.transaction() as db:
            db.execute("INSERT INTO traces VALUES (?, ?, ?, ?)",
                       (trace_id, owner, json.dumps(snapshot), time.time()))
        return trace_id

    def get(self, owner: str, trace_id: str) -> dict | None:
        with self.db.connect() as db:
            row = db.execute("SELECT snapshot FROM traces WHERE id = ? AND owner = ?", (trace_id, owner)).fetchone()
        return json.loads(row["snapshot"]) if row else None

    def owns(self, owner: str, trace_id: str) -> bool:
        """Whether the owner keeps this trace, without reading it (its kept file is served: webapp/web/heavy.py)."""
        with self.db.connect() as db:
            row = db.execute("SELECT 1 FROM traces WHERE id = ? AND owner = ?", (trace_id, owner)).fetchone()
        return row is not None

    def recent(self, owner: str, limit: int = 10) -> list[dict]:
        with self.db.connect() as db:
            rows = db.execute("SELECT id, snapshot, created_at FROM traces WHERE owner = ?"
                              f" AND snapshot NOT LIKE '{SWEEP_PREFIX}%'"
                              " ORDER BY created_at DESC LIMIT ?", (owner, limit)).fetchall()
        out = []
        for row in rows:
            snapshot = json.loads(row["snapshot"])
            out.append({"id": row["id"], "created_at": row["created_at"], "source": snapshot.get("source"),
                        "request": snapshot["request"], "summary": snapshot.get("summary", {}),
                        "checkpoint": snapshot.get("checkpoint")})
        return out

    # -- sweeps (webapp/loops/sweeping.py): kept beside the traces, so that quotas, retention and sharing
    # count and treat them as traces; a sweep's snapshot starts {"sweep": 1, …}, which no trace's does
    def save_sweep(self, owner: str, snapshot: dict) -> str:
        assert next(iter(snapshot)) == "sweep"
        return self.save(owner, snapshot)

    def recent_sweeps(self, owner: str, limit: int = 10) -> list[dict]:
        with self.db.connect() as db:
            rows = db.execute("SELECT id, snapshot, created_at FROM traces WHERE owner = ?"
                              f" AND snapshot LIKE '{SWEEP_PREFIX}%'"
                              " ORDER BY created_at DESC LIMIT ?", (owner, limit)).fetchall()
        return [{"id": row["id"], "created_at": row["created_at"], "spec": json.loads(row["snapshot"])["spec"]}
                for row in rows]

    # -- sharing ---------------------------------------------------------------------------------
    def share(self, owner: str, trace_id: str) -> str | None:
        """The trace's read-only token, made on first use; None when the trace is not the owner's."""
        with self.db.transaction() as db:
            if db.execute("SELECT 1 FROM traces WHERE id = ? AND owner = ?", (trace_id, owner)).fetchone() is None:
                return None
            token = secrets.token_urlsafe(18)  # 144 bits: not guessable, not derived from the id
            db.execute("INSERT INTO trace_shares VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                       (token, trace_id, time.time()))
            return db.execute("SELECT token FROM trace_shares WHERE trace_id = ?", (trace_id,)).fetchone()["token"]

    def share_token(self, owner: str, trace_id: str) -> str | None:
        with self.db.connect() as db:
            row = db.execute("SELECT s.token FROM trace_shares s JOIN traces t ON t.id = s.trace_id"
                             " WHERE t.id = ? AND t.owner = ?", (trace_id, owner)).fetchone()
        return row["token"] if row else None

    def unshare(self, owner: str, trace_id: str) -> None:
        with self.db.transaction() as db:
            db.execute("DELETE FROM trace_shares WHERE trace_id IN (SELECT id FROM traces WHERE id = ? AND owner = ?)",
                       (trace_id, owner))

    def shared(self, token: str) -> dict | None:
        with self.db.connect() as db:
            row = db.execute("SELECT t.snapshot FROM trace_shares s JOIN traces t ON t.id = s.trace_id"
                             " WHERE s.token = ?", (token,)).fetchone()
        return json.loads(row["snapshot"]) if row else None

    # -- what the quotas and the retention ask (OwnerStore, webapp/browsers.py; webapp/web/quotas.py) -
    def stored_bytes(self, *owners: str) -> int:
        """Characters of saved snapshots these owners keep, together."""
        total = 0
        with self.db.connect() as db:
            for marks, batch in in_batches(owners):
                total += int(db.execute("SELECT COALESCE(SUM(LENGTH(snapshot)), 0) FROM traces"
                                        f" WHERE owner IN ({marks})", batch).fetchone()[0])
        return total

    def forget_owner(self, owner: str) -> int:
        """Delete every trace of `owner` (and so their read-only links) -> how many."""
        with self.db.transaction() as db:
            return db.execute("DELETE FROM traces WHERE owner = ?", (owner,)).rowcount

    def keep_newest(self, owner: str, keep: int) -> None:
        """Delete this owner's traces but the `keep` newest."""
        with self.db.transaction() as db:
            db.execute("DELETE FROM traces WHERE owner = ? AND id NOT IN (SELECT id FROM traces WHERE owner = ?"
                       " ORDER BY created_at DESC LIMIT ?)", (owner, owner, keep))

    def delete_older(self, owner_prefix: str, before: float) -> int:
        """Delete the traces of owners whose name starts with `owner_prefix`, saved before `before` -> how many."""
        with self.db.transaction() as db:
            return db.execute("DELETE FROM traces WHERE substr(owner, 1, ?) = ? AND created_at < ?",
                              (len(owner_prefix), owner_prefix, before)).rowcount
