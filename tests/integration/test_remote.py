"""A Glassbox whose chat replies come from a second, real Glassbox serving /v1 (GLASSBOX_CHAT_BACKEND):
both are gunicorn with gunicorn.conf.py on loopback ports. The front is configured with two base URLs,
one that never answers (skipped) and one whose server is started only after the front is up (slow to
start: the first reply waits for it). The backend asks for an API key (the front's key file). Then the
backend is killed with -9 mid-reply: the reply fails with a clear error and keeps its text."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
from pathlib import Path

import openai
import pytest

from tests.integration.helpers import (
    TOKEN_SPAN,
    as_sse_text,
    message_id,
    read_until,
    saved_message,
    start_reply,
    streamed_text,
)
from tests.support.servers import Client, Gunicorn, free_port, model_env, wait_until
from tests.v1.conftest import KEY, write_keys

pytestmark = pytest.mark.integration


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(front, backend not started yet, base URL of the backend)."""
    work = tmp_path_factory.mktemp("remote")
    keys = write_keys(work / "api_keys", KEY)
    backend = Gunicorn(work / "backend", {**model_env(work, chat_arch="tiny:0.05"),
                                          "GLASSBOX_API_KEYS": str(keys)})
    never = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    front = Gunicorn(work / "front", {**model_env(work, chat_arch="tiny:0.05"), "GLASSBOX_HEARTBEAT_SECONDS": "0.2",
                                      "GLASSBOX_CHAT_BACKEND": f"openai:{never},{backend.url}/v1",
                                      "GLASSBOX_CHAT_BACKEND_KEY_FILE": str(keys),
                                      "GLASSBOX_CHAT_BACKEND_WAIT_SECONDS": "90",
                                      "GLASSBOX_CHAT_BACKEND_RETRY_SECONDS": "1"})
    front.start()
    try:
        yield front, backend
    finally:
        front.stop()
        backend.stop()


def test_a_reply_waits_for_a_backend_slow_to_start_then_streams_with_its_odds(pair):
    front, backend = pair
    client = Client(front.url)
    assert client.get("/readyz").status == 200  # the front is up without its backend
    url = start_reply(client, tokens=20)
    events = []
    reader = threading.Thread(target=lambda: events.extend(client.open_stream(url, timeout=120).events()),
                              daemon=True)
    reader.start()
    backend.start()  # some seconds later: the reply waited for it
    reader.join(120)
    assert not reader.is_alive()
    saved = saved_message(front.instance, message_id(url))
    assert saved["status"] == "complete", saved["error"]
    shaded = [e for e in events if e.name == "token" and TOKEN_SPAN.match(e.data)]
    assert len(shaded) == 20  # each token shown with its probability (the backend's logprobs)
    assert as_sse_text(saved["content"]) == streamed_text(events)
    assert backend.metrics()['glassbox_jobs_total{outcome="done"}'] == 1  # the backend wrote it
    with sqlite3.connect(front.instance / "glassbox.sqlite3") as db:
        details = db.execute("SELECT odds FROM reply_details WHERE message_id = ?", (saved["id"],)).fetchone()
    odds = json.loads(details[0])
    assert len(odds) == 20 and all(0 < row[1] <= 1 and row[5] for row in odds)  # p and alternatives kept
    base = f"/chat/c/{saved['conversation_id']}/m/{saved['id']}"
    for path in (f"{base}/tokens", f"{base}/tokens/0", f"{base}/prompt"):  # the glass-box views of it
        assert client.get(path).status == 200, path


def test_the_fronts_own_v1_answers_through_the_backend(pair):
    front, backend = pair
    api = openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    reply = api.chat.completions.create(model="glassbox", messages=[{"role": "user", "content": "Hi"}],
                                        max_tokens=5, logprobs=True, top_logprobs=3)
    assert reply.choices[0].finish_reason == "length" and len(reply.choices[0].logprobs.content) == 5
    assert backend.metrics()['glassbox_jobs_total{outcome="done"}'] == 2  # the page's reply, then this one


def test_stop_closes_the_connection_to_the_backend_which_stops_its_job(pair):
    front, backend = pair
    client = Client(front.url)
    url = start_reply(client, tokens=250)
    events, seen, reader = read_until(client, url, 5)
    assert seen.wait(60)
    conversation = saved_message(front.instance, message_id(url))["conversation_id"]
    stop = client.post(f"/chat/c/{conversation}/m/{message_id(url)}/stop", htmx=True)
    assert stop.status in (200, 204), stop.text
    reader.join(60)
    assert not reader.is_alive()
    saved = saved_message(front.instance, message_id(url))
    assert saved["status"] == "stopped" and 0 < len(saved["content"])
    assert wait_until(lambda: backend.metrics()['glassbox_jobs_total{outcome="cancelled"}'] >= 1, 30)


def test_a_backend_killed_mid_reply_fails_the_reply_clearly_and_keeps_its_text(pair):
    front, backend = pair
    assert backend.proc is not None and backend.proc.poll() is None
    client = Client(front.url)
    url = start_reply(client, tokens=250)
    events, seen, reader = read_until(client, url, 10)
    assert seen.wait(60)
    for pid in [backend.proc.pid] + children(backend.proc.pid):  # the master first: no new worker
        os.kill(pid, signal.SIGKILL)
    backend.proc.wait(10)
    reader.join(60)
    assert not reader.is_alive()
    saved = wait_until(lambda: (m := saved_message(front.instance, message_id(url)))["status"] != "pending" and m, 30)
    assert saved["status"] == "error"
    assert "stopped mid-reply" in saved["error"] and backend.url in saved["error"]
    assert len(saved["content"]) > 0 and as_sse_text(saved["content"]).startswith(streamed_text(events[:10]))
    assert client.get("/readyz").status == 200  # the front lives on
