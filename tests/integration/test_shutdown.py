"""SIGTERM to gunicorn mid-stream, behind nginx: the running reply is saved as stopped, every open
stream (running or queued) ends with its `done` event, the process exits within its graceful
timeout, and after a restart the reply's stream replays what was saved without running anything."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from tests.integration.conftest import require_nginx
from tests.integration.helpers import as_sse_text, message_id, saved_message, start_reply, start_run, streamed_text
from tests.support.servers import Client, Gunicorn, Nginx, model_env, wait_until

pytestmark = pytest.mark.integration

PREFIX = "/glassbox"


def read_in_background(client: Client, url: str) -> dict:
    result = {"events": [], "ended": None}

    def read():
        for event in client.open_stream(url, timeout=60).events():
            result["events"].append(event)
        result["ended"] = time.monotonic()

    result["thread"] = threading.Thread(target=read, daemon=True)
    result["thread"].start()
    return result


def test_sigterm_mid_stream_saves_the_partial_reply_ends_every_stream_and_replays_after_restart(tmp_path):
    require_nginx()
    env = {**model_env(tmp_path, chat_arch="tiny:0.05", loop_delay=0.1), "GLASSBOX_GRACEFUL_TIMEOUT": "20",
           "GLASSBOX_MAX_BATCH": "1"}  # one row: bob's reply waits for it
    app = Gunicorn(tmp_path / "instance", env).start()
    proxy = Nginx(tmp_path / "nginx", app.port).start()
    try:
        alice, bob = Client(proxy.url), Client(proxy.url)
        running_url = start_reply(alice, PREFIX, tokens=250)
        queued_url = start_reply(bob, PREFIX, tokens=250)  # waits for alice's row
        run_url = start_run(bob, PREFIX, steps=40)         # runs between alice's steps (4 s of loops)
        running, queued, run = (read_in_background(alice, running_url), read_in_background(bob, queued_url),
                                read_in_background(bob, run_url))
        assert wait_until(lambda: sum(e.name == "token" for e in running["events"]) >= 5, 30)

        app.signal(signal.SIGTERM)
        sent = time.monotonic()
        for reader in (running, queued, run):
            reader["thread"].join(15)
            assert reader["ended"] is not None, "a stream was left open"
            assert reader["events"][-1].name == "done"
        assert max(r["ended"] for r in (running, queued, run)) - sent < 5
        assert app.wait(25) == 0, app.log()[-2000:]
        assert time.monotonic() - sent < 20  # within gunicorn's graceful timeout

        partial = saved_message(app.instance, message_id(running_url))
        assert partial["status"] == "stopped" and 5 <= partial["tokens"] < 250
        assert as_sse_text(partial["content"]).startswith(streamed_text(running["events"]))  # nothing lost
        assert "stopped" in running["events"][-1].data
        never_ran = saved_message(app.instance, message_id(queued_url))
        assert never_ran["status"] == "stopped" and never_ran["content"] == ""
        assert "Stopped" in run["events"][-1].data
        assert "job id=" in app.log() and "outcome=cancelled" in app.log()

        # Restarted on the same port and instance folder: the stream replays the saved reply, at once.
        app = Gunicorn(tmp_path / "instance", env, port=app.port).start()
        replay = list(alice.open_stream(running_url).events())
        assert [e.name for e in replay] == ["done"]
        assert replay[0].data == running["events"][-1].data
        metrics = app.metrics()
        assert metrics['glassbox_jobs_total{outcome="submitted"}'] == 0  # nothing ran again
        assert metrics["glassbox_tokens_total"] == 0
        gone = list(bob.open_stream(run_url).events())  # the run was never saved: the stream says so, and ends
        assert [e.name for e in gone] == ["done"] and "no longer here" in gone[0].data
        page = alice.get(f"{PREFIX}/chat/c/" + running_url.split("/")[4])
        assert page.status == 200 and "sse-connect" not in page.text  # no stream left to reconnect to
    finally:
        proxy.stop()
        app.stop()


def paced_trace(steps: int) -> bytes:
    """A trace file whose loops arrived a second apart: its replay takes REPLAY_MAX_SECONDS (20 s)."""
    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    rows = [{"loop": n, "prediction": "B", "direct_prediction": None, "stop_probability": 0.0,
             "top3": [{"symbol": "B", "probability": 0.9}], "arrival_seconds": float(n)} for n in range(1, steps + 1)]
    return json.dumps({"schema_version": 1, "request": {"mapping": [[a, letters[(i + 1) % 26]] for i, a in
                                                                    enumerate(letters)], "start": "A", "steps": steps},
                       "trace": rows, "summary": {"stop_reason": "cap"}}).encode()


def test_sigterm_ends_a_paced_replay_at_once_with_its_done_event(tmp_path):
    require_nginx()
    env = {**model_env(tmp_path), "GLASSBOX_GRACEFUL_TIMEOUT": "20"}
    app = Gunicorn(tmp_path / "instance", env).start()
    proxy = Nginx(tmp_path / "nginx", app.port).start()
    try:
        viewer = Client(proxy.url)
        viewer.get(f"{PREFIX}/loops/")
        boundary = "glassboxtest"
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"trace\"; filename=\"t.json\"\r\n"
                f"Content-Type: application/json\r\n\r\n").encode() + paced_trace(30)
        body += f"\r\n--{boundary}--\r\n".encode()
        uploaded = viewer.request("POST", f"{PREFIX}/loops/traces/upload", body=body,
                                  headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        assert uploaded.status == 200 and "/loops/traces/" in uploaded.url, uploaded.text[:500]
        replay = read_in_background(viewer, uploaded.url.split("?")[0] + "/replay")
        assert wait_until(lambda: sum(e.name == "rows" for e in replay["events"]) >= 2, 10)

        app.signal(signal.SIGTERM)
        sent = time.monotonic()
        replay["thread"].join(10)
        assert replay["ended"] is not None and replay["ended"] - sent < 3, "the replay kept its pace"
        assert replay["events"][-1].name == "done"  # the browser closes instead of reconnecting
        assert app.wait(15) == 0, app.log()[-2000:]
        assert time.monotonic() - sent < 10
    finally:
        proxy.stop()
        app.stop()
