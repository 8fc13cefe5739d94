"""A database written by the last release (schema version 1: webapp/db/schema.sql as it was, with no
schema_version table) is upgraded in place: the migrations run once, every row is kept, and the stores
read and write it. The same migrations bring a new PostgreSQL database to the same version."""

from __future__ import annotations

import sqlite3

from webapp.chat.decode.types import ReplyStats
from webapp.chat.store import ChatStore
from webapp.db import SCHEMA, Database, migrations, open_database
from webapp.loops.store import TraceStore

NEWEST = migrations.files("sqlite")[-1][0]


def release_database(path) -> None:
    """What the last release wrote: its schema, a conversation, a reply it was writing when it stopped."""
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA.read_text())
        db.execute("INSERT INTO conversations VALUES ('c1', 'me', 'Hello', 1.5, 2.5, 2)")
        db.execute("INSERT INTO messages (id, conversation_id, role, content, status, created_at, parent_id)"
                   " VALUES (1, 'c1', 'user', 'Hello', 'complete', 1.5, NULL)")
        db.execute("INSERT INTO messages (id, conversation_id, role, content, status, settings, created_at,"
                   " parent_id) VALUES (2, 'c1', 'assistant', 'Hi th', 'pending', '{}', 2.5, 1)")
        db.execute("INSERT INTO reply_details VALUES (2, '{\"ids\": [1]}', NULL)")
        db.execute("INSERT INTO traces VALUES ('t1', 'me', '{\"request\": {}}', 3.0)")
        db.execute("INSERT INTO browsers VALUES ('me', '10.0.0.1', 1.0, 3.0)")


def test_a_release_database_is_upgraded_in_place_keeping_every_row(tmp_path):
    path = tmp_path / "glassbox.sqlite3"
    release_database(path)
    Database(path).init()
    Database(path).init()  # a second start finds it up to date
    with sqlite3.connect(path) as db:
        applied = [version for (version,) in db.execute("SELECT version FROM schema_version ORDER BY version")]
        assert applied == [number for number, _ in migrations.files("sqlite")] and applied[-1] == NEWEST  # once each
        columns = {row[1] for row in db.execute("PRAGMA table_info(messages)")}
    assert {"runner", "lease_until", "intervention"} <= columns
    store = ChatStore(Database(path))
    shown = store.messages("c1")
    assert [(m.content, m.status) for m in shown] == [("Hello", "complete"), ("Hi th", "stopped")]
    assert store.details(2).prompt == {"ids": [1]}
    assert TraceStore(Database(path)).get("me", "t1") == {"request": {}}
    turn = store.begin_turn("me", "c1", user_text="Again", branch_from=None, settings={}, prompt={})
    store.finish_reply(turn.reply_id, "Yes", "complete", None, ReplyStats())
    assert [m.content for m in store.messages("c1")] == ["Hello", "Hi th", "Again", "Yes"]
    assert [m.intervention for m in store.messages("c1")] == [None] * 4  # the release's rows: nothing switched off
    record = {"heads": ["1.0"], "mlps": [], "mode": "zero"}
    ablated = store.begin_turn("me", "c1", user_text=None, branch_from=turn.user_id, settings={}, prompt={},
                               intervention=record)
    assert store.message("c1", ablated.reply_id).intervention == record


def test_a_new_postgres_database_gets_every_migration_once(postgres_url):
    open_database(postgres_url).init()
    open_database(postgres_url).init()
    with open_database(postgres_url).connect() as db:
        versions = [row[0] for row in db.execute("SELECT version FROM schema_version ORDER BY version")]
    assert versions == [number for number, _ in migrations.files("postgres")]
    assert versions[-1] == NEWEST  # the same newest version as SQLite's
    with open_database(postgres_url).connect() as db:
        db.execute("SELECT intervention FROM messages LIMIT 1").fetchall()
