"""What a chat page costs the database: the SQL a request runs, counted at the database layer.

Counted: every statement the request's own thread sends to the database, PRAGMA, BEGIN and COMMIT
included (SQLite: the connection's trace callback; PostgreSQL: each statement a Connection executes). Not
counted: the reply itself, which the core's worker writes on its own thread (its progress and its end),
and the leases' thread. A tree read is a read of every message of a conversation (ChatStore's tree)."""

from __future__ import annotations

import re
import sqlite3
import threading

import pytest

from tests.chat.web.test_conversations import conversation_id_of, send
from tests.conftest import csrf_of
from webapp.web.state import glassbox

TREE_READ = re.compile(r"SELECT (\w+\.)?\*.* FROM messages( \w+)? WHERE (\w+\.)?conversation_id = \S+( ORDER BY|$)",
                       re.IGNORECASE | re.DOTALL)


class Statements:
    """The statements this thread runs while `counting`."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.counting = False
        self.run: list[str] = []

    def heard(self, sql: str) -> None:
        if self.counting and threading.get_ident() == self.thread:
            self.run.append(" ".join(sql.split()))

    def tree_reads(self) -> list[str]:
        return [s for s in self.run if TREE_READ.search(s)]

    def __enter__(self) -> Statements:
        self.run, self.counting = [], True
        return self

    def __exit__(self, *exc) -> None:
        self.counting = False


@pytest.fixture
def statements(monkeypatch) -> Statements:
    from webapp.db import postgres
    heard = Statements()
    connect = sqlite3.connect

    def traced(*args, **kwargs):
        connection = connect(*args, **kwargs)
        connection.set_trace_callback(heard.heard)
        return connection
    monkeypatch.setattr(sqlite3, "connect", traced)
    execute = postgres.Connection.execute

    def counted(self, sql, parameters=()):
        heard.heard(sql)
        return execute(self, sql, parameters)
    monkeypatch.setattr(postgres.Connection, "execute", counted)
    return heard


def test_the_fifth_send_runs_at_most_15_statements_and_reads_the_tree_once(chat_app, statements, monkeypatch):
    # The send's own statements: a browser's visit of the day (recorded once a day) and the purge of idle
    # browsers (once a minute) are held off, so that a run across midnight or a slow machine counts the same.
    from webapp.web import retention
    monkeypatch.setattr(retention, "today", lambda: 1)
    glassbox(chat_app).browsers.purged_at = float("inf")
    client = chat_app.test_client()
    csrf = csrf_of(client, "/chat/")
    first = send(client, "Hello", csrf, max_new_tokens="5", seed="1")
    cid = conversation_id_of(first)
    for turn in range(2, 5):  # without JavaScript: each waits for its whole reply
        assert send(client, f"Turn {turn}", csrf, htmx=False, conversation_id=cid, max_new_tokens="5",
                    seed="1").status_code == 303
    with statements:
        fifth = send(client, "Turn 5", csrf, conversation_id=cid, max_new_tokens="5", seed="1")
    assert fifth.status_code == 200 and "Turn 5" in fifth.get_data(as_text=True)
    said = f"{len(statements.run)} statements, {len(statements.tree_reads())} tree reads:\n" + "\n".join(
        s[:160] for s in statements.run)
    assert len(statements.run) <= 15, said  # before the page model: 51 statements, 3 tree reads; now 14 (PostgreSQL 13)
    assert len(statements.tree_reads()) == 1, said


def test_a_conversation_page_reads_its_tree_once_and_nothing_from_its_templates(chat_app, statements, monkeypatch):
    from webapp.web import retention
    monkeypatch.setattr(retention, "today", lambda: 1)
    glassbox(chat_app).browsers.purged_at = float("inf")
    client = chat_app.test_client()
    csrf = csrf_of(client, "/chat/")
    sent = send(client, "Hello", csrf, htmx=False, max_new_tokens="5", seed="1")
    client.post(f"{sent.headers['Location']}/share", data={"csrf_token": csrf})
    with statements:
        page = client.get(sent.headers["Location"]).get_data(as_text=True)
    assert "/chat/shared/" in page and "this conversation so far" in page  # the link, the window arithmetic
    said = "\n".join(s[:160] for s in statements.run)
    assert len(statements.tree_reads()) == 1 and len(statements.run) <= 3, said  # now 2
