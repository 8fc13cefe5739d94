"""SQLite access (the default: a file in the instance folder): one short-lived connection per use, WAL
so streams and pages don't block.

Connections are opened per call rather than per request because results are also saved
from the core's worker thread, outside any request.

Every write goes through `transaction()`, which begins with BEGIN IMMEDIATE: a deferred transaction
reads a snapshot, and when another writer commits before it writes, SQLite cannot upgrade it and fails
at once ("database is locked"), without waiting. IMMEDIATE takes the write lock first, waiting up to
BUSY_TIMEOUT_SECONDS for it, so writers wait their turn instead. Each write transaction is kept short
(a large delete goes in batches) so that the wait stays far below the timeout.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from webapp.config import ConfigError
from webapp.db import migrations

SCHEMA = Path(__file__).with_name("schema.sql")  # schema version 1; later versions: migrations/sqlite/
BUSY_TIMEOUT_SECONDS = 10.0  # how long a writer waits for another's lock before "database is locked"


class Database:
    """The history in one SQLite file, used by one process (the instance lock, webapp/instance.py)."""

    dialect = "sqlite"

    def __init__(self, path: str | Path, runner: str = "") -> None:
        self.path = str(path)
        self.runner = runner  # this front end's id, recorded with each reply it runs (webapp/chat/store.py)

    def __str__(self) -> str:
        return self.path

    def init(self) -> None:
        with self.connect() as db:
            _for_writes(db)
            db.execute("PRAGMA journal_mode=WAL")
            _add_branch_columns(db)  # a database made before messages formed a tree
            _add_column(db, "messages", "token_view", "INTEGER NOT NULL DEFAULT 0")
            _add_column(db, "messages", "wait_seconds", "REAL")
            # Tables and indexes an older database lacks (messages_by_parent among them) are made here
            db.executescript(SCHEMA.read_text())
            # Browsers that kept rows before browsers were recorded: idle from now on, not from their first row
            db.execute("INSERT OR IGNORE INTO browsers (owner, address, created_at, seen_at)"
                       " SELECT owner, '', MIN(created_at), CAST(strftime('%s', 'now') AS REAL) FROM"
                       " (SELECT owner, created_at FROM conversations UNION ALL SELECT owner, created_at FROM traces)"
                       " WHERE owner NOT LIKE '%:%' GROUP BY owner")
        migrations.apply(self, self.dialect)
        with self.connect() as db:
            _for_writes(db)
            # A reply that was being generated when the process died will never finish (one process uses
            # the file, so every pending reply was the dead process's).
            db.execute("UPDATE messages SET status = 'stopped' WHERE status = 'pending'")

    def open_checked(self) -> None:
        """init(), created 0600 and checked to be writable: start-up stops with a message naming the file
        instead of every save failing later. SQLite gives its -wal and -shm files the database's mode."""
        try:
            if not os.path.exists(self.path):
                os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            self.init()
        except (sqlite3.Error, OSError) as error:
            raise ConfigError(f"The database {self.path} cannot be opened for writing: {error}") from None
        problem = self.writable()
        if problem:
            raise ConfigError(f"The database {self.path} cannot be written: {problem}")
        # Held open for the app's life: SQLite deletes the -wal and -shm files when the last connection
        # closes and makes them again on the next open, which a full disk refuses ("disk I/O error")
        # even for reads. With them kept, a full disk fails the writes only, and pages still show.
        self._keeper: sqlite3.Connection | None = sqlite3.connect(self.path, check_same_thread=False)
        self._keeper.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()

    def close(self) -> None:
        keeper, self._keeper = getattr(self, "_keeper", None), None
        if keeper is not None:
            keeper.close()

    def writable(self) -> str | None:
        """None when a write goes through now; else why not (for /readyz and start-up)."""
        try:
            with self.transaction() as db:
                # A real write (a table of one row): BEGIN IMMEDIATE alone takes a lock but writes nothing.
                db.execute("CREATE TABLE IF NOT EXISTS write_probe (id INTEGER PRIMARY KEY, at REAL)")
                db.execute("INSERT OR REPLACE INTO write_probe VALUES (1, julianday('now'))")
        except (sqlite3.Error, OSError) as error:
            return str(error) or type(error).__name__
        return None

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        """A connection in autocommit mode, for reads (writes: transaction(), which sets what writes need;
        a read runs no statement but its own)."""
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
        db.row_factory = sqlite3.Row
        try:
            yield db
        finally:
            db.close()

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """Reads that see one state of the database, whatever commits meanwhile."""
        with self.connect() as db:
            db.execute("BEGIN")
            try:
                yield db
            finally:
                db.execute("COMMIT")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction holding the write lock from its first statement: committed at the end of
        the block, rolled back if it raises."""
        with self.connect() as db:
            _for_writes(db)
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                if db.in_transaction:  # SQLite may have rolled back already (a full disk does)
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")


def _for_writes(db: sqlite3.Connection) -> None:
    """What a connection that writes needs (each connection's own settings; reads need neither)."""
    db.execute("PRAGMA foreign_keys=ON")
    # WAL's recommended durability: a commit survives the process dying (kill -9) but not a power cut
    # before the next checkpoint; FULL would fsync every commit, and the write lock is held meanwhile.
    db.execute("PRAGMA synchronous=NORMAL")


def _add_branch_columns(db: sqlite3.Connection) -> None:
    """Messages were a list; now a tree (parent_id) with one branch shown (leaf_id). An older database
    gets the columns, each message the one before it as its parent, each conversation its last message."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(messages)")}
    if not columns or "parent_id" in columns:
        return
    db.execute("BEGIN IMMEDIATE")
    db.execute("ALTER TABLE messages ADD COLUMN parent_id INTEGER REFERENCES messages (id) ON DELETE CASCADE")
    db.execute("ALTER TABLE conversations ADD COLUMN leaf_id INTEGER")
    db.execute("UPDATE messages SET parent_id = (SELECT MAX(p.id) FROM messages p WHERE"
               " p.conversation_id = messages.conversation_id AND p.id < messages.id)")
    db.execute("UPDATE conversations SET leaf_id = (SELECT MAX(id) FROM messages m"
               " WHERE m.conversation_id = conversations.id)")
    db.execute("COMMIT")


def _add_column(db: sqlite3.Connection, table: str, column: str, definition: str) -> None:
    """A column added since a database was made (no-op on a new or an up-to-date database)."""
    columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    if columns and column not in columns:
        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
