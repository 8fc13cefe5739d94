"""No reply lost on faults: a running reply is saved as it grows, so kill -9 keeps what the user saw; a
save that fails (a really full filesystem, a read-only one) fails the reply with the reason and ends the
stream; /readyz reports a database that cannot be written; a second Glassbox on one folder is refused."""

from __future__ import annotations

import html
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import csrf_of, make_app, wait_for
from tests.integration.helpers import as_sse_text, message_id, read_until, saved_message, start_reply, wait_saved
from tests.support.chat_models import tiny_chat_model
from tests.support.servers import Client, Gunicorn, model_env
from webapp.web.state import glassbox

pytestmark = pytest.mark.integration


def shown_text(events) -> str:
    """The reply as the page shows it: token fragments without their markup."""
    return "".join(html.unescape(re.sub(r"<[^>]*>", "", e.data)) for e in events if e.name == "token")


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


def test_kill_9_keeps_what_the_user_saw_and_a_second_glassbox_is_refused(tmp_path):
    env = model_env(tmp_path, chat_arch="tiny:0.05")
    app = Gunicorn(tmp_path / "instance", env).start()
    try:
        second = Gunicorn(tmp_path / "instance", env)
        with pytest.raises(RuntimeError) as refused:
            second.start(ready_timeout=60)
        assert "already used by a running Glassbox" in str(refused.value)
        assert str(tmp_path / "instance" / "glassbox.lock") in str(refused.value)

        client = Client(app.url)
        url = start_reply(client, tokens=250)
        events, seen, _ = read_until(client, url, 40, timeout=60)
        assert seen.wait(30)
        shown = shown_text(list(events))
        wait_saved(lambda: saved_message(app.instance, message_id(url))["content"], shown)
        for pid in children(app.proc.pid) + [app.proc.pid]:  # the worker first: it must not exit cleanly
            os.kill(pid, signal.SIGKILL)
        app.proc.wait(10)
        saved = saved_message(app.instance, message_id(url))
        assert saved["status"] == "pending"  # nobody got to say it stopped: it really died
        assert as_sse_text(saved["content"]).startswith(shown) and len(saved["content"]) >= len(shown) > 0

        app = Gunicorn(tmp_path / "instance", env, port=app.port).start()  # the lock died with the process
        after = saved_message(app.instance, message_id(url))
        assert after["status"] == "stopped" and after["content"] == saved["content"]
    finally:
        app.stop()


@pytest.fixture
def small_filesystem(tmp_path):
    """A 3 MiB tmpfs of the test's own (needs root and mount; skipped cleanly otherwise)."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(folder: Path) -> None:
    """Write zeros until the filesystem says it is full (unbuffered: nothing left to fail on close)."""
    with open(folder / "filler", "wb", buffering=0) as file:
        try:
            while True:
                file.write(b"\0" * 4096)
        except OSError:
            pass


def test_a_full_disk_fails_the_reply_with_the_reason_and_ends_the_stream(tmp_path, small_filesystem):
    app = make_app(small_filesystem, {"chat": tiny_chat_model(tmp_path / "chat", seconds_per_step=0.03)})
    try:
        client = app.test_client()
        csrf = csrf_of(client, "/chat/")
        sent = client.post("/chat/send", data={"csrf_token": csrf, "content": "hi", "max_new_tokens": "150"},
                           headers={"HX-Request": "true"})
        url = re.findall(r'sse-connect="([^"]+)"', sent.get_data(as_text=True))[-1]
        stream = client.get(url, buffered=False)
        chunks = iter(stream.response)
        text = ""
        while text.count("event: token") < 5:
            text += next(chunks).decode() if isinstance(text, str) else ""
        fill(small_filesystem)  # really full: the next save of the growing reply cannot be written
        started = time.monotonic()
        for chunk in chunks:
            text += chunk.decode()
        assert time.monotonic() - started < 10  # ended soon after the failed save, not after 150 tokens
        final = text.split("event: done")[1]
        assert "database or disk is full" in final and "Could not save" in final
        assert 'sse-connect' not in final  # the browser does not reopen it
        core = glassbox(app).core
        assert wait_for(lambda: core.counters["failed"] == 1)

        ready = client.get("/readyz")  # a real write is tried: the disk is still full
        assert ready.status_code == 503 and ready.get_json()["reason"] == (
            "the database cannot be written: database or disk is full")
        assert client.get("/chat/").status_code == 200  # pages still show what was saved
        (small_filesystem / "filler").unlink()
        assert client.get("/readyz").status_code == 200  # room again: ready again
        reply = int(re.search(r"/m/(\d+)/stream", url).group(1))
        assert wait_for(lambda: saved_message(small_filesystem / "instance", reply)["status"] == "error", timeout=15)
        saved = saved_message(small_filesystem / "instance", reply)  # never left pending: saved as the user was told
        assert "Could not save" in saved["error"] and "database or disk is full" in saved["error"]
    finally:
        glassbox(app).core.shutdown()
