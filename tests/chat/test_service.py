"""The chat service: how many threads a reply runs on (1 for a small model, the worker's for a large
one, or the setting), and a reply taken back when what it replaces cannot be changed."""

import re
import sqlite3

import pytest
import torch

from tests.conftest import csrf_of, make_app, sse_events
from tests.support.chat_models import tiny_chat_model
from tests.support.executors import FunctionJobs
from webapp.chat.boot import SMALL_MODEL_BYTES, load_model, reply_threads
from webapp.config import Settings
from webapp.core import Job
from webapp.web.state import glassbox


def test_small_models_reply_on_one_thread_large_ones_on_the_workers():
    small = torch.nn.Linear(1024, 1024)  # 4 MiB of fp32
    large = torch.nn.Linear(8192, 8192, device="meta")  # 256 MiB, never allocated
    assert small.weight.nbytes < SMALL_MODEL_BYTES < large.weight.nbytes
    assert reply_threads(small, 0) == 1 and reply_threads(large, 0) == 0
    assert reply_threads(small, 2) == 2 and reply_threads(large, 3) == 3  # the setting wins


def test_the_bundled_model_is_small():
    assert load_model(Settings()).torch_threads == 1


def test_a_reply_runs_on_the_models_threads_and_the_worker_gets_its_own_back(tmp_path):
    loaded = tiny_chat_model(tmp_path / "chat")
    loaded.torch_threads = 1
    seen = []
    loaded.model.lm_head.register_forward_hook(lambda *args: seen.append(torch.get_num_threads()))
    app = make_app(tmp_path, {"chat": loaded}, torch_threads=2)
    core = glassbox(app).core
    try:
        client = app.test_client()
        sent = client.post("/chat/send", data={"csrf_token": csrf_of(client, "/chat/"), "content": "hi",
                                               "max_new_tokens": "3"}, headers={"HX-Request": "true"})
        url = sent.get_data(as_text=True).split('sse-connect="')[-1].split('"')[0]
        assert sse_events(client.get(url).get_data(as_text=True))[-1][0] == "done"
        assert seen and set(seen) == {1}
        core.executors["probe"] = FunctionJobs()
        probe = core.submit(Job("probe", "o", lambda job, c: job.result.update(threads=torch.get_num_threads())))
        list(probe.subscribe(0.05))
        assert probe.result["threads"] == 2
    finally:
        core.shutdown()


def test_a_new_version_whose_saving_fails_is_taken_back(tmp_path, monkeypatch):
    import sqlite3

    from webapp.chat.store import ChatStore
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat")})
    app.config["PROPAGATE_EXCEPTIONS"] = False  # answer 500, as in production
    core = glassbox(app).core
    try:
        client = app.test_client()
        first = client.post("/chat/send", data={"csrf_token": csrf_of(client, "/chat/"), "content": "hi",
                                                "max_new_tokens": "3"})  # no JavaScript: waits, redirects
        cid = first.headers["Location"].rsplit("/", 1)[1]
        before = client.get(f"/chat/c/{cid}").get_data(as_text=True)
        ids = re.compile(r'id="message-(\d+)"')
        user_id = ids.findall(before)[0]

        def busy(*args, **kwargs):
            raise sqlite3.OperationalError("database is locked")
        monkeypatch.setattr(ChatStore, "begin_turn", busy)
        edit = client.post(f"/chat/c/{cid}/m/{user_id}/edit",
                           data={"csrf_token": csrf_of(client, f"/chat/c/{cid}"), "content": "changed"})
        assert edit.status_code == 500
        monkeypatch.undo()
        after = client.get(f"/chat/c/{cid}").get_data(as_text=True)
        assert ids.findall(after) == ids.findall(before)  # nothing of the new version was saved
        assert "changed" not in after
    finally:
        core.shutdown()


def test_a_save_lost_with_postgresql_is_said_without_its_socket_or_host():
    # what a failed save says is kept under the reply and shown to its reader
    import psycopg

    from webapp.chat.leases import saving
    from webapp.core.jobs import Job
    from webapp.db import SaveFailed

    def lost():
        raise psycopg.OperationalError('connection to server on socket "/tmp/pg-x1/.s.PGSQL.5432" failed: '
                                       "No such file or directory")
    with pytest.raises(SaveFailed) as failed:
        saving(lost)
    job = Job("chat", "someone", None)
    job.fail_saving(failed.value)
    assert job.save_error == "Could not save the result: the database cannot be reached"

    def full():
        raise sqlite3.OperationalError("database or disk is full")
    with pytest.raises(SaveFailed, match="^database or disk is full$"):  # SQLite's words name no file: kept
        saving(full)
