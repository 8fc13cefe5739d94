"""PostgreSQL that cannot be reached: at start-up it stops the app with a message naming it; while
running, every request that needs it answers a clear 503 (a page, or JSON) within the timeout instead of
a 500 or a hang, /readyz says why, and requests work again once it is back; a write kept waiting for the
writers' lock past the timeout answers 503 too. A cluster of this module's own is stopped and started
(the session's is shared by other tests)."""

from __future__ import annotations

import time

import psycopg
import pytest

from tests.conftest import csrf_of, make_app
from tests.support.chat_models import tiny_chat_model
from tests.support.postgres import Cluster, require_postgres
from tests.support.servers import free_port
from webapp.config import ConfigError
from webapp.db.postgres import WRITER_LOCK
from webapp.web.state import glassbox

TIMEOUT = 2.0


@pytest.fixture(scope="module")
def cluster():
    own = Cluster(require_postgres()).start()
    yield own
    own.remove()


def test_an_unreachable_database_stops_start_up_naming_it(tmp_path):
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(ConfigError, match="GLASSBOX_DATABASE_URL") as error:
        make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat")},
                 database_url=f"postgresql://glassbox:secret@127.0.0.1:{port}/history", database_timeout=TIMEOUT)
    assert f"'history' at 127.0.0.1:{port}" in str(error.value) and "secret" not in str(error.value)
    assert time.monotonic() - started < 30


def test_a_database_that_goes_away_answers_503_then_works_again_when_it_is_back(cluster, tmp_path):
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat")}, database_url=cluster.new_database(tcp=True),
                   database_timeout=TIMEOUT)
    try:
        client = app.test_client()
        csrf = csrf_of(client, "/chat/")
        first = client.post("/chat/send", data={"csrf_token": csrf, "content": "kept", "max_new_tokens": "2"})
        assert first.status_code == 303
        cluster.stop()
        try:
            started = time.monotonic()
            page = client.get(first.headers["Location"])
            assert page.status_code == 503 and page.headers["Retry-After"]
            assert "The database cannot be reached just now" in page.get_data(as_text=True)
            as_json = client.get("/chat/", headers={"Accept": "application/json"})
            assert as_json.status_code == 503 and "cannot be reached" in as_json.get_json()["error"]
            lost = client.post("/chat/send", data={"csrf_token": csrf, "content": "lost", "max_new_tokens": "2"})
            assert lost.status_code == 503
            ready = client.get("/readyz")
            assert ready.status_code == 503 and "database" in ready.get_json()["reason"]
            assert time.monotonic() - started < 4 * (TIMEOUT + 2)  # no hang: each fails within the timeout
        finally:
            cluster.start()
        assert client.get("/readyz").status_code == 200
        back = client.get(first.headers["Location"])
        assert back.status_code == 200 and "kept" in back.get_data(as_text=True)
        again = client.post("/chat/send", data={"csrf_token": csrf, "content": "again", "max_new_tokens": "2"})
        assert again.status_code == 303
    finally:
        glassbox(app).core.shutdown()


def test_the_first_request_after_a_restart_works_though_connections_were_kept(cluster, tmp_path):
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat")}, database_url=cluster.new_database(),
                   database_timeout=TIMEOUT)
    try:
        client = app.test_client()
        assert client.get("/chat/").status_code == 200 and client.get("/readyz").status_code == 200
        assert glassbox(app).db.idle.connections  # kept for the next request
        cluster.stop()
        cluster.start()  # nothing asked meanwhile: the kept connections are to the server that stopped
        assert client.get("/readyz").status_code == 200
        assert client.get("/chat/").status_code == 200
    finally:
        glassbox(app).core.shutdown()


def test_a_writer_kept_waiting_past_the_timeout_answers_503_and_saves_nothing(postgres_url, tmp_path):
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat")}, database_url=postgres_url,
                   database_timeout=TIMEOUT)
    try:
        client = app.test_client()
        csrf = csrf_of(client, "/chat/")
        with psycopg.connect(postgres_url, autocommit=True) as other:  # another front end's long write
            other.execute("SELECT pg_advisory_lock(%s)", (WRITER_LOCK,))
            busy = client.post("/chat/send", data={"csrf_token": csrf, "content": "waits", "max_new_tokens": "2"})
            assert busy.status_code == 503 and "The database is busy" in busy.get_data(as_text=True)
            assert client.get("/chat/").status_code == 200  # reads take no lock
            other.execute("SELECT pg_advisory_unlock(%s)", (WRITER_LOCK,))
        with glassbox(app).db.connect() as db:
            assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0
        sent = client.post("/chat/send", data={"csrf_token": csrf, "content": "now", "max_new_tokens": "2"})
        assert sent.status_code == 303
    finally:
        glassbox(app).core.shutdown()
