"""The browsers that keep data here: when each was made, from which address, when it was last seen.

There are no accounts: a browser is the owner id in its session cookie. This table lets storage be
bounded where a per-browser quota cannot reach: one address making new browsers (each with a fresh
quota), and browsers that never come back (their rows kept for ever). "Seen" is written at most once a
day per browser (the day is kept in its cookie), so recording it costs one small write a day.
"""

from __future__ import annotations

import time

from webapp.db import AnyDatabase

DAY = 86400.0
NEW_BROWSER_SECONDS = DAY  # a browser counts as new, for its address's limit, this long after it is made


class Browsers:
    def __init__(self, db: AnyDatabase) -> None:
        self.db = db
        self.purged_at = 0.0  # when idle browsers were last deleted (webapp/web/retention.py)

    def made(self, owner: str, address: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self.db.transaction() as db:
            db.execute("INSERT INTO browsers (owner, address, created_at, seen_at) VALUES (?, ?, ?, ?)"
                       " ON CONFLICT DO NOTHING", (owner, address, now, now))

    def seen(self, owner: str, address: str, now: float | None = None) -> None:
        """The browser came back (a browser from before this table was kept is recorded now)."""
        now = time.time() if now is None else now
        with self.db.transaction() as db:
            db.execute("INSERT INTO browsers (owner, address, created_at, seen_at) VALUES (?, ?, ?, ?)"
                       " ON CONFLICT (owner) DO UPDATE SET seen_at = excluded.seen_at", (owner, address, now, now))

    def new_browsers_bytes(self, owner: str, now: float | None = None) -> int | None:
        """What the browsers made from `owner`'s address in the last NEW_BROWSER_SECONDS keep (characters
        of stored text, as the per-browser quota counts); None when `owner` itself is not new."""
        since = (time.time() if now is None else now) - NEW_BROWSER_SECONDS
        address = "(SELECT address FROM browsers WHERE owner = ? AND created_at > ?)"  # NULL: not new
        young = f"SELECT owner FROM browsers WHERE address = {address} AND created_at > ?"
        with self.db.connect() as db:  # one statement
            row = db.execute(f"SELECT {address},"
                             " (SELECT COALESCE(SUM(LENGTH(m.content) + COALESCE(LENGTH(d.prompt), 0)"
                             " + COALESCE(LENGTH(d.odds), 0)), 0) FROM conversations c"
                             " JOIN messages m ON m.conversation_id = c.id"
                             f" LEFT JOIN reply_details d ON d.message_id = m.id WHERE c.owner IN ({young})),"
                             f" (SELECT COALESCE(SUM(LENGTH(snapshot)), 0) FROM traces WHERE owner IN ({young}))",
                             (owner, since, owner, since, since, owner, since, since)).fetchone()
        if row[0] is None:
            return None
        return int(row[1]) + int(row[2])

    def idle(self, before: float, limit: int) -> list[str]:
        """Browsers last seen before `before`, the longest idle first."""
        with self.db.connect() as db:
            rows = db.execute("SELECT owner FROM browsers WHERE seen_at < ? ORDER BY seen_at LIMIT ?",
                              (before, limit)).fetchall()
        return [r[0] for r in rows]

    def forget(self, owner: str) -> None:
        """The browser's traces and its row (its conversations are deleted by the chat store first)."""
        with self.db.transaction() as db:
            db.execute("DELETE FROM traces WHERE owner = ?", (owner,))
            db.execute("DELETE FROM browsers WHERE owner = ?", (owner,))
