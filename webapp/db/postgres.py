"""PostgreSQL access (GLASSBOX_DATABASE_URL): the same interface as webapp/db/sqlite.py, for several
front ends on one database.

The stores write one SQL for both: `?` placeholders (turned into psycopg's here), rows read by name
or by position, `INSERT ... ON CONFLICT`, `RETURNING`. What differs is here and in the schema files.

Writers take turns, as on SQLite: every write transaction first takes one transaction-level advisory
lock, so two writers never conflict (no serialization failure or deadlock to retry, in any process),
the checks the stores make inside a transaction (a conversation's limit of messages) hold, and a
writer waits for the lock at most GLASSBOX_DATABASE_TIMEOUT seconds (lock_timeout). Reads take no lock.

Connections are opened with a connect timeout and each statement is bounded (statement_timeout), so a
database that went away fails a request within GLASSBOX_DATABASE_TIMEOUT instead of hanging. Up to
IDLE_CONNECTIONS are kept between uses (a new one costs the server a process). A kept connection is
checked with an empty query before each use, and every kept one is dropped once one fails, so the
first request after the database is back works instead of meeting a connection to the server that died.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from webapp.config import ConfigError
from webapp.db import migrations

WRITER_LOCK = 0x676C617373  # the advisory lock every write transaction takes first ("glass")
IDLE_CONNECTIONS = 16  # connections kept open between uses; more are opened when needed, then closed


class Row(tuple):
    """A row read by position or by column name, and dict(row)-able, as sqlite3.Row."""

    column_names: tuple[str, ...]
    positions: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self.positions[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> tuple[str, ...]:
        return self.column_names


def _rows(cursor: Any) -> Any:
    names = tuple(column.name for column in cursor.description or ())
    index = {name: i for i, name in enumerate(names)}

    def make(values: Any) -> Row:
        row = Row(values)
        row.column_names, row.positions = names, index
        return row
    return make


class Connection:
    """A psycopg connection taking the stores' SQL: `?` placeholders become `%s` (and `%` is escaped).

    PostgreSQL's text cannot hold NUL, which SQLite's can: a model may write one (a byte-level tokenizer's
    token 0), and refusing the save would fail the reply. It is kept as U+FFFD, the replacement character,
    which is how a page shows a NUL anyway. (People's messages cannot hold one: webapp/chat/web/forms.py.)"""

    def __init__(self, connection: psycopg.Connection) -> None:
        self.raw = connection

    def execute(self, sql: str, parameters: Any = ()) -> Any:
        values = tuple(v.replace("\x00", "\ufffd") if isinstance(v, str) else v for v in parameters)
        return self.raw.execute(sql.replace("%", "%%").replace("?", "%s"), values)

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


class Idle:
    """The connections kept between uses, of this process only: a forked child (gunicorn's worker, a
    benchmark's process) must not use its parent's sockets, so it starts with none of them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.connections: list[psycopg.Connection] = []

    def take(self) -> psycopg.Connection | None:
        with self.lock:
            if self.pid != os.getpid():
                self.pid, self.connections = os.getpid(), []  # the parent's: left alone, never closed here
            return self.connections.pop() if self.connections else None

    def give(self, connection: psycopg.Connection) -> None:
        with self.lock:
            if self.pid == os.getpid() and len(self.connections) < IDLE_CONNECTIONS:
                self.connections.append(connection)
                return
        connection.close()

    def drop_all(self) -> None:
        with self.lock:
            gone, self.connections = self.connections, []
        for connection in gone:
            connection.close()


class PostgresDatabase:
    dialect = "postgres"

    def __init__(self, url: str, runner: str = "", timeout: float = 10.0) -> None:
        self.url = url
        self.runner = runner  # this front end's id, recorded with each reply it runs (webapp/chat/store.py)
        self.timeout = timeout
        self.idle = Idle()

    def __str__(self) -> str:
        """Where the database is, without its password."""
        try:
            parts = conninfo_to_dict(self.url)
        except psycopg.ProgrammingError:
            return "GLASSBOX_DATABASE_URL"
        where = f"{parts.get('host') or 'localhost'}:{parts.get('port') or 5432}"
        return f"PostgreSQL database {parts.get('dbname') or parts.get('user') or ''!r} at {where}"

    def init(self) -> None:
        migrations.apply(self, self.dialect)
        with self.transaction() as db:
            # A reply whose front end died will never finish. Other front ends' running replies are theirs:
            # only this front end's own (it is starting, so they are dead) and those whose lease ran out.
            db.execute("UPDATE messages SET status = 'stopped' WHERE status = 'pending'"
                       " AND (runner IS NULL OR runner = ? OR lease_until < ?)", (self.runner, time.time()))

    def open_checked(self) -> None:
        """init(), and a write checked: start-up stops with a message naming the database when it cannot
        be reached or written, instead of every request failing later."""
        try:
            self.init()
        except psycopg.Error as error:
            raise ConfigError(f"The {self} (GLASSBOX_DATABASE_URL) cannot be used: "
                              f"{str(error).strip() or type(error).__name__}") from None
        problem = self.writable()
        if problem:
            raise ConfigError(f"The {self} (GLASSBOX_DATABASE_URL) cannot be written: {problem}")

    def close(self) -> None:
        self.idle.drop_all()

    def writable(self) -> str | None:
        """None when a write goes through now; else why not (for /readyz and start-up)."""
        try:
            with self.transaction() as db:
                db.execute("INSERT INTO write_probe VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = excluded.at",
                           (time.time(),))
        except psycopg.Error as error:
            return str(error).strip() or type(error).__name__
        return None

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A connection in autocommit mode, for reads (writes: transaction())."""
        raw = self._kept() or self._open()
        try:
            yield Connection(raw)
        finally:
            if raw.broken:
                self.idle.drop_all()  # the server went away (or restarted): the kept ones are dead too
            self._give_back(raw)

    def _kept(self) -> psycopg.Connection | None:
        """A kept connection that still answers (an empty query), or None."""
        while (raw := self.idle.take()) is not None:
            try:
                raw.execute("")
                return raw
            except psycopg.Error:
                raw.close()
                self.idle.drop_all()
        return None

    def _open(self) -> psycopg.Connection:
        millis = max(1, int(self.timeout * 1000))
        return psycopg.connect(self.url, autocommit=True, row_factory=_rows,
                               connect_timeout=max(2, round(self.timeout)),  # libpq's least is 2 s
                               # a statement, a wait for a lock, a transaction left idle: none hangs
                               options=f"-c statement_timeout={millis} -c lock_timeout={millis}"
                                       f" -c idle_in_transaction_session_timeout={max(millis, 60000)}",
                               # a server that stops answering on TCP (a cut network) fails the request
                               keepalives=1, keepalives_idle=max(1, round(self.timeout)), keepalives_interval=1,
                               keepalives_count=3, tcp_user_timeout=millis)

    def _give_back(self, raw: psycopg.Connection) -> None:
        if raw.closed or raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raw.close()
        else:
            self.idle.give(raw)

    @contextmanager
    def snapshot(self) -> Iterator[Connection]:
        """Reads that see one state of the database, whatever commits meanwhile."""
        with self.connect() as db:
            db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                yield db
            finally:
                _end(db, "COMMIT")

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A write transaction holding the writers' lock from its first statement: committed at the end
        of the block, rolled back if it raises."""
        with self.connect() as db:
            db.execute("BEGIN")
            try:
                db.execute("SELECT pg_advisory_xact_lock(?)", (WRITER_LOCK,))
                yield db
            except BaseException:
                _end(db, "ROLLBACK")
                raise
            db.execute("COMMIT")


def _end(db: Connection, statement: str) -> None:
    """End a transaction, unless the connection is gone (the server ended it then)."""
    if not db.raw.closed and db.in_transaction:
        try:
            db.execute(statement)
        except psycopg.OperationalError:
            pass
