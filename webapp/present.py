"""Follow links (issue 31): a presenter's revocable read-only link to what they do as it happens.

A link is a row (migration 006): its owner, what it follows (a conversation, or the owner's Loop lab) and the
state the presenter's page last reported (the player's position, the trace shown). Every front end reads the
same rows, so a follower on another front end sees the link revoked (the row gone) and each report.
`Changes` wakes this process's followers at once when something they follow changes here; followers of
another front end's presenter notice it at their next read of the database (FOLLOW_POLL_SECONDS).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from dataclasses import dataclass

from webapp.db import AnyDatabase

# How often a follower reads the database for what no wake-up tells it (a presenter on another front end,
# a revoked link): a few small reads a second per follower.
FOLLOW_POLL_SECONDS = 0.2
# The largest state a presenter's page may report (a few numbers and names).
MAX_STATE_BYTES = 2000


# A presenting session's kind: one link for everything its owner opens (issue 51). Its state names the link of
# the conversation or Loop lab the presenter has open ({"kind": ..., "target": ...}); its followers follow that.
SESSION = "session"

SHORT_CODE_LETTERS = 6  # a follow link's short code: 30 bits, typed from a projector (/f/ABC123)


def short_code(token: str) -> str:
    """A follow link's short code, "K7QX2M": the first letters of its token's hash in base 32 (letters and 2-7;
    a 0 or 1 typed for O or I reads as that letter). It says nothing of the token; guessing one is 1 in a billion,
    for a link that lives as long as a talk."""
    return base64.b32encode(hashlib.sha256(token.encode()).digest()).decode()[:SHORT_CODE_LETTERS]


@dataclass(frozen=True)
class PresentLink:
    token: str
    owner: str
    kind: str  # "chat" or "loops"
    target: str  # the conversation's id; "" for the Loop lab
    state: dict
    state_version: int


class PresentLinks:
    def __init__(self, db: AnyDatabase) -> None:
        self.db = db

    def make(self, owner: str, kind: str, target: str) -> str:
        """The link's token (made once per owner and thing presented; the same one until revoked)."""
        with self.db.transaction() as db:
            db.execute("INSERT INTO present_links (token, owner, kind, target, created_at) VALUES (?, ?, ?, ?, ?)"
                       " ON CONFLICT DO NOTHING", (secrets.token_urlsafe(18), owner, kind, target, time.time()))
            row = db.execute("SELECT token FROM present_links WHERE owner = ? AND kind = ? AND target = ?",
                             (owner, kind, target)).fetchone()
        return row[0]

    def of(self, owner: str, kind: str, target: str) -> str | None:
        with self.db.connect() as db:
            row = db.execute("SELECT token FROM present_links WHERE owner = ? AND kind = ? AND target = ?",
                             (owner, kind, target)).fetchone()
        return row[0] if row else None

    def revoke(self, owner: str, kind: str, target: str) -> None:
        with self.db.transaction() as db:
            db.execute("DELETE FROM present_links WHERE owner = ? AND kind = ? AND target = ?", (owner, kind, target))

    def here(self, owner: str, kind: str, target: str) -> tuple[str | None, str | None]:
        """The owner's page of (kind, target) is open -> (its link's token, the owner's presenting session's),
        in one read while nothing changes. While a session runs it now shows this page, whose link is made if
        there is none. A link the session made is the session's own: it is revoked when the session moves on, so
        the room keeps no way into a page it was shown once (the session's state says which it made: "made")."""
        with self.db.connect() as db:
            rows = db.execute("SELECT kind, token, state FROM present_links WHERE owner = ?"
                              " AND (kind = ? AND target = ? OR kind = ? AND target = '')",
                              (owner, kind, target, SESSION)).fetchall()
        own = next((row[1] for row in rows if row[0] == kind), None)
        session = next((row for row in rows if row[0] == SESSION), None)
        if session is None:
            return own, None
        state = json.loads(session[2]) if session[2] else {}
        if own is not None and state.get("kind") == kind and state.get("target") == target:
            return own, session[1]  # the session is here already
        with self.db.transaction() as db:
            made = secrets.token_urlsafe(18)
            db.execute("INSERT INTO present_links (token, owner, kind, target, created_at) VALUES (?, ?, ?, ?, ?)"
                       " ON CONFLICT DO NOTHING", (made, owner, kind, target, time.time()))
            own = db.execute("SELECT token FROM present_links WHERE owner = ? AND kind = ? AND target = ?",
                             (owner, kind, target)).fetchone()[0]
            left = state.get("made")
            if isinstance(left, str) and left and left != own:  # the page the session leaves, if it made its link
                db.execute("DELETE FROM present_links WHERE token = ? AND owner = ?", (left, owner))
            where = {"kind": kind, "target": target, "made": own if own == made else ""}
            db.execute("UPDATE present_links SET state = ?, state_version = state_version + 1 WHERE token = ?",
                       (json.dumps(where), session[1]))
        CHANGES.notify(f"{SESSION}:{owner}")
        return own, session[1]

    def made_by_session(self, token: str) -> str | None:
        """The presenting session whose own link `token` is (made for the page it shows), else None."""
        link = self.get(token)
        session = self.of(link.owner, SESSION, "") if link is not None and link.kind != SESSION else None
        shown = self.get(session) if session else None
        return session if shown is not None and shown.state.get("made") == token else None

    def shown_by(self, session: PresentLink) -> PresentLink | None:
        """The link a session shows now (None: the presenter opened nothing yet, or stopped presenting it)."""
        kind, target = session.state.get("kind"), session.state.get("target")
        if not isinstance(kind, str) or not isinstance(target, str):
            return None
        token = self.of(session.owner, kind, target)
        return self.get(token) if token else None

    def token_of_code(self, code: str) -> str | None:
        """The live link whose short code this is (short_code), typed in any case; None when there is none."""
        code = code.strip().upper().replace("0", "O").replace("1", "I")
        if len(code) != SHORT_CODE_LETTERS:
            return None
        with self.db.connect() as db:
            tokens = [row[0] for row in db.execute("SELECT token FROM present_links").fetchall()]
        return next((token for token in tokens if short_code(token) == code), None)

    def get(self, token: str) -> PresentLink | None:
        with self.db.connect() as db:
            row = db.execute("SELECT token, owner, kind, target, state, state_version FROM present_links"
                             " WHERE token = ?", (token,)).fetchone()
        if row is None:
            return None
        return PresentLink(row[0], row[1], row[2], row[3], json.loads(row[4]) if row[4] else {}, row[5])

    def report(self, owner: str, kind: str, target: str, state: dict) -> bool:
        """Keep what the presenter's page shows now -> whether a link took it (False: not presenting)."""
        with self.db.transaction() as db:
            return db.execute("UPDATE present_links SET state = ?, state_version = state_version + 1"
                              " WHERE owner = ? AND kind = ? AND target = ?",
                              (json.dumps(state), owner, kind, target)).rowcount > 0

    def report_all(self, owner: str, kind: str, state: dict) -> list[str]:
        """Keep `state` as what every one of the owner's links of this kind shows -> their targets."""
        with self.db.transaction() as db:
            targets = [row[0] for row in db.execute("SELECT target FROM present_links WHERE owner = ? AND kind = ?",
                                                    (owner, kind)).fetchall()]
            if targets:
                db.execute("UPDATE present_links SET state = ?, state_version = state_version + 1"
                           " WHERE owner = ? AND kind = ?", (json.dumps(state), owner, kind))
        return targets

    # An OwnerStore (webapp/browsers.py): an idle browser's links go with its conversations and traces.
    def stored_bytes(self, *owners: str) -> int:
        """Not counted against the storage limits: a link's state is bounded (MAX_STATE_BYTES) and there is one
        link per thing presented, whose own rows are counted."""
        return 0

    def forget_owner(self, owner: str) -> int:
        """Revoke every link the owner made (a Loop-lab link outlives no trace: it follows the owner; a presenting
        session's Stop ends all it showed)."""
        with self.db.transaction() as db:
            return db.execute("DELETE FROM present_links WHERE owner = ?", (owner,)).rowcount


class Changes:
    """Versions per key (a conversation, an owner's Loop lab), bumped when it changes in this process, so
    that followers here wake at once instead of at their next poll."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._versions: dict[str, int] = {}

    def notify(self, key: str) -> None:
        with self._cond:
            self._versions[key] = self._versions.get(key, 0) + 1
            self._cond.notify_all()

    def version(self, key: str) -> int:
        with self._cond:
            return self._versions.get(key, 0)

    def wait(self, key: str, seen: int, timeout: float) -> int:
        """Wait until `key` passes version `seen` or `timeout` passes -> its version."""
        with self._cond:
            self._cond.wait_for(lambda: self._versions.get(key, 0) != seen, timeout)
            return self._versions.get(key, 0)


CHANGES = Changes()  # the process's: every app in it shares it (keys carry the ids they follow)
