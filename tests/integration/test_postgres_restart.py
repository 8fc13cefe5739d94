"""Real gunicorn front ends on one PostgreSQL: a second front end starts beside the first (no instance
lock), a front end killed with -9 mid-reply keeps what the user saw, and when it starts again it marks
its own dead reply stopped while another front end's running reply goes on untouched."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.integration.helpers import as_sse_text, message_id, read_until, start_reply, wait_saved
from tests.integration.test_faults import children, shown_text
from tests.support.servers import Client, Gunicorn, model_env
from webapp.db import open_database

pytestmark = pytest.mark.integration


def saved(url: str, message: int) -> dict:
    with open_database(url).connect() as db:
        return dict(db.execute("SELECT * FROM messages WHERE id = ?", (message,)).fetchone())


def test_a_front_end_killed_mid_reply_restarts_stopping_its_own_reply_only(tmp_path, postgres_cluster):
    database = postgres_cluster.new_database(tcp=True)
    env = {**model_env(tmp_path, chat_arch="tiny:0.05"), "GLASSBOX_DATABASE_URL": database,
           "GLASSBOX_SECRET_KEY": "one key for every front end"}
    a = Gunicorn(tmp_path / "a", env).start()
    # another folder, the same database: no lock refuses it. Its replies are slower (0.2 s a token), so
    # that one runs on b, watched, through a's death and restart
    b = Gunicorn(tmp_path / "b", {**env, **model_env(tmp_path / "b-models", chat_arch="tiny:0.2")}).start()
    try:
        on_b = Client(b.url)
        slow = start_reply(on_b, tokens=260, content="Hi")
        elsewhere = message_id(slow)
        read_until(on_b, slow, 10_000, timeout=120)  # a subscriber keeps it running
        on_a = Client(a.url)
        url = start_reply(on_a, tokens=250)
        events, seen, _ = read_until(on_a, url, 40, timeout=60)
        assert seen.wait(30)
        # PostgreSQL keeps a NUL the byte model wrote as U+FFFD, which is also how a browser shows one
        shown = shown_text(list(events)).replace("\x00", "\ufffd")
        wait_saved(lambda: saved(database, message_id(url))["content"], shown)
        for pid in children(a.proc.pid) + [a.proc.pid]:  # the worker first: it must not exit cleanly
            os.kill(pid, signal.SIGKILL)
        a.proc.wait(10)
        dead = saved(database, message_id(url))
        assert dead["status"] == "pending"  # nobody got to say it stopped: it really died
        assert as_sse_text(dead["content"]).startswith(shown) and len(dead["content"]) >= len(shown) > 0
        assert Client(b.url).get("/readyz").status == 200

        a = Gunicorn(tmp_path / "a", env, port=a.port).start()  # the same folder: the same front-end id
        after = saved(database, message_id(url))
        assert after["status"] == "stopped" and after["content"] == dead["content"]
        running = saved(database, elsewhere)
        assert running["status"] == "pending" and running["runner"] != after["runner"]
        assert running["content"] and running["lease_until"] > time.time()
    finally:
        a.stop()
        b.stop()
