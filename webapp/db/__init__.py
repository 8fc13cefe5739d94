"""Where the history is kept: SQLite in the instance folder (the default, webapp/db/sqlite.py), or
PostgreSQL when GLASSBOX_DATABASE_URL names one (webapp/db/postgres.py), for several front ends.
Both have one interface (connect, snapshot, transaction, init, open_checked, writable, close), take the
same SQL from the stores, and version their schema alike (webapp/db/migrations.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence

import psycopg

from webapp.db.postgres import PostgresDatabase
from webapp.db.sqlite import BUSY_TIMEOUT_SECONDS, SCHEMA, Database

AnyDatabase = Database | PostgresDatabase
# What any database access may raise: a page that can go on without the write catches these
DATABASE_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error, psycopg.Error)
URL_SCHEMES = ("postgresql://", "postgres://")
IN_BATCH = 500  # values bound in one `IN (?, ...)`: well within SQLite's and PostgreSQL's limits on parameters

__all__ = ["BUSY_TIMEOUT_SECONDS", "DATABASE_ERRORS", "SCHEMA", "AnyDatabase", "Database", "PostgresDatabase",
           "in_batches", "is_url", "open_database"]


class SaveFailed(Exception):
    """A write that failed, said as a user may read it (public_reason): shown under a reply, so never a
    host, a socket path or a password from the database's own message."""


def public_reason(error: BaseException) -> str:
    """What a user may be told of a database error: PostgreSQL's messages name its socket or host, so
    they are said in general words; SQLite's name no file ("database or disk is full") and stay."""
    if isinstance(error, psycopg.OperationalError):
        return "the database cannot be reached"
    if isinstance(error, psycopg.Error):
        return f"the database refused the write ({type(error).__name__})"
    return str(error) or type(error).__name__


def is_url(location: str) -> bool:
    return location.startswith(URL_SCHEMES)


def open_database(location: str, *, runner: str = "", timeout: float = BUSY_TIMEOUT_SECONDS) -> AnyDatabase:
    """A PostgreSQL database for a postgresql:// URL, else the SQLite file at that path (not opened yet)."""
    if is_url(location):
        return PostgresDatabase(location, runner=runner, timeout=timeout)
    return Database(location, runner=runner)


def in_batches(values: Sequence[str]) -> Iterator[tuple[str, tuple[str, ...]]]:
    """`values` IN_BATCH at a time, each with its placeholders: (\"?, ?, ?\", (a, b, c))."""
    for start in range(0, len(values), IN_BATCH):
        batch = tuple(values[start:start + IN_BATCH])
        yield ", ".join("?" * len(batch)), batch
