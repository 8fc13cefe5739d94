"""A full disk answers 507 with a message, on a page, an htmx fragment or JSON, and saves nothing.

The disk is made full for real, as SQLite sees it: every connection the app opens gets
`PRAGMA max_page_count` at the database's current size, so any write that needs a new page fails
with SQLITE_FULL, as it would on a full disk (no root mount needed in a test)."""

from __future__ import annotations

import io
import json
import sqlite3
import string
from contextlib import contextmanager

import pytest

from tests.conftest import csrf_of, make_app, wait_for
from tests.support.chat_models import tiny_chat_model
from tests.support.loop_models import bundle
from webapp.web.state import glassbox

HX = {"HX-Request": "true"}
CYCLE = [[a, b] for a, b in zip(string.ascii_uppercase, string.ascii_uppercase[1:] + "A")]
FULL = "The server&#39;s disk is full, so this was not saved."


@pytest.fixture
def app(tmp_path):
    models = {"chat": tiny_chat_model(tmp_path / "chat", block_size=4096), "loops": bundle()}
    # SQLite always: its full disk is what is simulated (PostgreSQL's outages: tests/test_stores_on_both_databases.py)
    app = make_app(tmp_path, models, torch_threads=1, database_url="")
    yield app
    glassbox(app).core.shutdown()


def fill_the_disk(app, monkeypatch) -> None:
    database = glassbox(app).db
    with database.connect() as db:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
    opened = database.connect

    @contextmanager
    def full_disk_connect():
        with opened() as db:
            db.execute(f"PRAGMA max_page_count = {pages}")
            yield db

    monkeypatch.setattr(database, "connect", full_disk_connect)


def counts(app) -> tuple[int, int, int]:
    with sqlite3.connect(glassbox(app).db.path) as db:
        return tuple(db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                     for t in ("conversations", "messages", "traces"))


def test_a_full_disk_answers_507_with_a_message_and_saves_nothing(app, monkeypatch):
    client = app.test_client()
    csrf = csrf_of(client, "/chat/")
    first = client.post("/chat/send", data={"csrf_token": csrf, "content": "hello", "max_new_tokens": "2"})
    assert first.status_code == 303
    conversation = first.headers["Location"].rsplit("/", 1)[-1]
    core = glassbox(app).core
    assert wait_for(lambda: core.counters["done"] == 1)
    snapshot = client.post("/api/loops/trace?stream=snapshots", json={"mapping": CYCLE, "start": "A", "steps": 60})
    trace = snapshot.get_data(as_text=True).splitlines()[-1].encode()
    before, submitted = counts(app), core.counters["submitted"]

    fill_the_disk(app, monkeypatch)
    long = "a long question " * 100  # needs pages of its own
    page = client.post("/chat/send", data={"csrf_token": csrf, "content": long, "conversation_id": conversation})
    assert page.status_code == 507 and FULL in page.get_data(as_text=True)
    fragment = client.post("/chat/send", data={"csrf_token": csrf, "content": long}, headers=HX)
    assert fragment.status_code == 507 and FULL in fragment.get_data(as_text=True)
    assert fragment.headers["HX-Retarget"] == "#flash"
    upload = client.post("/loops/traces/upload", content_type="multipart/form-data",
                         data={"csrf_token": csrf, "trace": (io.BytesIO(trace), "t.json")})
    assert upload.status_code == 507 and FULL in upload.get_data(as_text=True)
    assert counts(app) == before  # nothing half-saved
    assert core.counters["submitted"] == submitted  # no reply started for a turn not saved

    # what needs no new page still works on the full disk, and then deleting makes room
    assert client.get(f"/chat/c/{conversation}").status_code == 200
    assert client.post(f"/chat/c/{conversation}/delete", data={"csrf_token": csrf}).status_code == 303
    assert client.post("/chat/send", data={"csrf_token": csrf, "content": "short"}).status_code == 303


def test_json_routes_say_it_in_json(app, monkeypatch):
    client = app.test_client()
    csrf = csrf_of(client, "/chat/")
    fill_the_disk(app, monkeypatch)
    answer = client.post("/chat/send", data={"csrf_token": csrf, "content": "a long question " * 100},
                         headers={"Accept": "application/json"})
    assert answer.status_code == 507
    assert json.loads(answer.get_data())["error"].startswith("The server's disk is full, so this was not saved.")
