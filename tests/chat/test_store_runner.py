"""A pending reply records the front end that runs it and a lease its saves renew. A starting front end
stops the replies that died with a process: on SQLite (one process per file) every pending one; on
PostgreSQL (several front ends) its own and those whose lease ran out, never another's running reply."""

from __future__ import annotations

import time

from webapp.chat import store as chat_store
from webapp.chat.store import ChatStore
from webapp.db import open_database


def pending_reply(location: str, runner: str, owner: str = "me") -> int:
    store = ChatStore(open_database(location, runner=runner))
    return store.begin_turn(owner, None, user_text="hi", branch_from=None, settings={}, prompt={}).reply_id


def status(location: str, message_id: int) -> tuple[str, str | None, float | None]:
    with open_database(location).connect() as db:
        row = db.execute("SELECT status, runner, lease_until FROM messages WHERE id = ?", (message_id,)).fetchone()
    return row[0], row[1], row[2]


def test_a_pending_reply_records_its_front_end_and_its_saves_renew_the_lease(database_location):
    open_database(database_location).init()
    reply = pending_reply(database_location, "front-a")
    _, runner, lease = status(database_location, reply)
    assert runner == "front-a" and lease is not None
    assert time.time() < lease <= time.time() + chat_store.REPLY_LEASE_SECONDS
    time.sleep(0.05)
    ChatStore(open_database(database_location)).save_progress(reply, "so far")
    assert status(database_location, reply)[2] > lease


def test_on_postgres_a_starting_front_end_stops_its_own_and_expired_replies_only(postgres_url):
    open_database(postgres_url, runner="front-a").init()
    running_elsewhere = pending_reply(postgres_url, "front-a")
    mine = pending_reply(postgres_url, "front-b")
    expired = pending_reply(postgres_url, "front-c")
    with open_database(postgres_url).transaction() as db:  # front-c died two minutes ago and never came back
        db.execute("UPDATE messages SET lease_until = ? WHERE id = ?", (time.time() - 1, expired))
    open_database(postgres_url, runner="front-b").init()  # front-b restarts
    assert status(postgres_url, running_elsewhere)[0] == "pending"
    assert status(postgres_url, mine)[0] == "stopped"
    assert status(postgres_url, expired)[0] == "stopped"


def test_on_sqlite_a_starting_process_stops_every_pending_reply(tmp_path):
    location = str(tmp_path / "glassbox.sqlite3")
    open_database(location, runner="front-a").init()
    replies = [pending_reply(location, "front-a"), pending_reply(location, "front-b")]
    open_database(location, runner="front-b").init()  # one process per file: the others died with it
    assert [status(location, r)[0] for r in replies] == ["stopped", "stopped"]
