"""The browsers that keep data here: when each was made, from which address, when it was last seen.

There are no accounts: a browser is the owner id in its session cookie. This table lets storage be
bounded where a per-browser quota cannot reach: one address making new browsers (each with a fresh
quota), and browsers that never come back (their rows kept for ever). "Seen" is written at most once a
day per browser (the day is kept in its cookie), so recording it costs one small write a day.

What a browser keeps is in the demos' stores (webapp/chat/store.py, webapp/loops/store.py), each of which
answers `OwnerStore`: this table's SQL reads and writes this table only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Protocol

from webapp.db import AnyDatabase

DAY = 86400.0
NEW_BROWSER_SECONDS = DAY  # a browser counts as new, for its address's limit, this long after it is made


class OwnerStore(Protocol):
    """What a demo's store answers about the rows an owner (a browser, an API key) keeps there: the
    quotas (webapp/web/quotas.py) and the retention of idle browsers (webapp/web/retention.py) ask it."""

    def stored_bytes(self, *owners: str) -> int:
        """Characters of stored text these owners keep, together."""
        ...

    def forget_owner(self, owner: str) -> int:
        """Delete everything the owner keeps -> how many things (conversations, traces) went."""
        ...


class Browsers:
    def __init__(self, db: AnyDatabase) -> None:
        self.db = db
        self.purged_at = 0.0  # when idle browsers were last deleted (webapp/web/retention.py)

    def made(self, owner: str, address: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self.db.transaction() as db:
            db.execute("INSERT INTO browsers (owner, address, created_at, seen_at) VALUES (?, ?, ?, ?)"
                       " ON CONFLICT DO NOTHING", (owner, address, now, now))

    def forget_made_before(self, owner_prefix: str, before: float) -> int:
        """Delete the rows of owners starting with `owner_prefix` made before `before` -> rows deleted."""
        with self.db.transaction() as db:
            return db.execute("DELETE FROM browsers WHERE substr(owner, 1, ?) = ? AND created_at < ?",
                              (len(owner_prefix), owner_prefix, before)).rowcount

    def seen(self, owner: str, address: str, now: float | None = None) -> None:
        """The browser came back (a browser from before this table was kept is recorded now)."""
        now = time.time() if now is None else now
        with self.db.transaction() as db:
            db.execute("INSERT INTO browsers (owner, address, created_at, seen_at) VALUES (?, ?, ?, ?)"
                       " ON CONFLICT (owner) DO UPDATE SET seen_at = excluded.seen_at", (owner, address, now, now))

    def new_browsers_bytes(self, owner: str, stores: Iterable[OwnerStore], now: float | None = None) -> int | None:
        """What the browsers made from `owner`'s address in the last NEW_BROWSER_SECONDS keep in `stores`
        (characters of stored text, as the per-browser quota counts); None when `owner` itself is not new."""
        young = self.new_from_address_of(owner, now)
        return None if young is None else sum(store.stored_bytes(*young) for store in stores)

    def new_from_address_of(self, owner: str, now: float | None = None) -> list[str] | None:
        """The browsers made from `owner`'s address in the last NEW_BROWSER_SECONDS, `owner` among them;
        None when `owner` itself is not new."""
        since = (time.time() if now is None else now) - NEW_BROWSER_SECONDS
        with self.db.connect() as db:  # one statement: `owner` is among them when it is new, so none: not new
            rows = db.execute("SELECT owner FROM browsers WHERE created_at > ? AND address ="
                              " (SELECT address FROM browsers WHERE owner = ? AND created_at > ?)",
                              (since, owner, since)).fetchall()
        return [r[0] for r in rows] or None

    def idle(self, before: float, limit: int) -> list[str]:
        """Browsers last seen before `before`, the longest idle first."""
        with self.db.connect() as db:
            rows = db.execute("SELECT owner FROM browsers WHERE seen_at < ? ORDER BY seen_at LIMIT ?",
                              (before, limit)).fetchall()
        return [r[0] for r in rows]

    def forget(self, owner: str) -> None:
        """The browser's row (what it keeps in the stores is deleted first: webapp/web/retention.py)."""
        with self.db.transaction() as db:
            db.execute("DELETE FROM browsers WHERE owner = ?", (owner,))
