"""Schema versions, the same way on SQLite and PostgreSQL: numbered files in migrations/<dialect>/
(002_reply_runner.sql, ...), applied in order, once, each recording its number in schema_version.

All of them run in one write transaction, so two front ends starting at once on one PostgreSQL apply
them once (the second waits for the first's writer lock, then finds them applied), and a failure leaves
the database as it was. A file holds plain statements separated by semicolons; `--` starts a comment.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).with_name("migrations")


def files(dialect: str) -> list[tuple[int, Path]]:
    """(number, file) of the dialect's migrations, in order."""
    found = [(int(path.name.split("_", 1)[0]), path) for path in (FOLDER / dialect).glob("[0-9]*_*.sql")]
    return sorted(found)


def statements(text: str) -> list[str]:
    without_comments = re.sub(r"--[^\n]*", "", text)
    return [s.strip() for s in without_comments.split(";") if s.strip()]


def apply(database: Any, dialect: str) -> int:
    """Bring the database to the newest version -> the version it now has."""
    with database.transaction() as db:
        db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        current = db.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0
        for number, path in files(dialect):
            if number <= current:
                continue
            for statement in statements(path.read_text()):
                db.execute(statement)
            db.execute("INSERT INTO schema_version (version) VALUES (?)", (number,))
            current = number
    return current
