"""gunicorn alone, started as `make run` starts it (gunicorn.conf.py, wsgi:app): a chat reply streams
over plain HTTP, readiness waits for the warm-up, and the logs say what each job did but never what
anyone wrote."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

from tests.integration.helpers import as_sse_text, message_id, saved_message, start_reply, start_run, streamed_text
from tests.support.servers import ROOT, Client, Gunicorn, free_port, model_env, parse_metrics, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("gunicorn")
    app = Gunicorn(work / "instance", model_env(work, chat_arch="tiny:0.03", loop_delay=0.02)).start()
    yield app
    app.stop()


def test_a_chat_reply_streams_over_http(server):
    client = Client(server.url)
    url = start_reply(client, tokens=40)
    stream = client.open_stream(url)
    assert stream.status == 200
    assert stream.headers["Content-Type"].startswith("text/event-stream")
    assert stream.headers["Cache-Control"] == "no-cache" and stream.headers["X-Accel-Buffering"] == "no"
    events = list(stream.events())
    names = [e.name for e in events]
    assert stream.comments >= 1  # the opening comment that makes gunicorn send the headers at once
    assert names[0] in ("position", "running") and names[-1] == "done" and names.count("done") == 1
    assert names.count("token") >= 5
    assert events[-1].at - events[names.index("token")].at > 0.3  # spread over ~40 steps of 30 ms
    saved = saved_message(server.instance, message_id(url))
    assert saved["status"] == "complete" and saved["tokens"] == 40
    assert as_sse_text(saved["content"]) == streamed_text(events)  # the page shows what was streamed
    # Re-opening the finished stream replays it and closes; nothing is generated twice.
    before = server.metrics()['glassbox_jobs_total{outcome="submitted"}']
    again = list(client.open_stream(url).events())
    assert [e.name for e in again] == ["done"] and again[0].data == events[-1].data
    assert server.metrics()['glassbox_jobs_total{outcome="submitted"}'] == before


def test_one_log_line_per_job_with_its_figures_and_never_the_message_text(server):
    client = Client(server.url)
    secret = "Zanzibar-7431 is my password"
    url = start_reply(client, tokens=12, content=secret)
    list(client.open_stream(url).events())
    run = start_run(client, steps=5)
    list(client.open_stream(run).events())
    job_id = run.split("/")[3]
    assert wait_until(lambda: f"job id={job_id}" in server.log(), 5)
    log = server.log()
    assert "Zanzibar" not in log and "password" not in log
    chat = re.findall(r"job id=\w+ seq=\d+ kind=chat outcome=done wait_ms=\d+ run_ms=\d+ tokens=(\d+)", log)
    assert "12" in chat
    assert re.search(rf"job id={job_id} seq=\d+ kind=loops outcome=done wait_ms=\d+ run_ms=\d+ rows=(\d+)", log)
    access = [line for line in log.splitlines() if "gunicorn.access" in line]
    assert any(re.search(r'method=POST path="/chat/send" status=200 bytes=\d+ ms=\d+', a) for a in access)


def test_metrics_describe_the_core(server):
    metrics = server.metrics()
    for name in ("glassbox_queue_length", "glassbox_running_jobs", "glassbox_open_streams", "glassbox_ready",
                 'glassbox_jobs_total{outcome="done"}', "glassbox_tokens_total", "glassbox_loop_rows_total",
                 'glassbox_model_load_seconds{model="chat"}', 'glassbox_request_seconds_bucket{le="+Inf"}',
                 'glassbox_threads{kind="request_pool"}', 'glassbox_job_run_seconds_count'):
        assert name in metrics, name
    assert metrics["glassbox_ready"] == 1 and metrics["glassbox_accepting_jobs"] == 1


def test_readiness_answers_503_until_the_models_are_warmed_up(tmp_path):
    # Warm-up generates two tokens: at 1.5 s a step that takes seconds, while /healthz already answers.
    app = Gunicorn(tmp_path / "instance", model_env(tmp_path, chat_arch="tiny:1.5"))
    try:
        app.start(ready_timeout=0)
        client = Client(app.url)
        assert wait_until(lambda: _answers(client, "/healthz") == 200, 60)
        early = client.get("/readyz")
        assert early.status == 503 and "warming up" in early.text
        assert parse_metrics(client.get("/metrics").text)["glassbox_ready"] == 0
        assert wait_until(lambda: _answers(client, "/readyz") == 200, 60)
        assert parse_metrics(client.get("/metrics").text)["glassbox_ready"] == 1
    finally:
        app.stop()


def _answers(client, path):
    try:
        return client.get(path, timeout=2).status
    except OSError:
        return None


def read_response(reader) -> tuple[int, bytes]:
    """One HTTP/1.1 answer with a Content-Length from a connection's buffered reader -> (status, body)."""
    status = int(reader.readline().split()[1])
    headers = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, reader.read(int(headers["content-length"]))


def test_a_body_too_large_is_answered_and_the_kept_alive_connection_still_works(server):
    """gunicorn announces keep-alive on the 413 but closes a connection whose large body nobody read;
    nginx then sends its next request (anyone's) into the closed connection: a 502. The app reads the
    body before answering, so the connection stays usable."""
    body = b"content=" + b"x" * 900_000  # over the app's limit, under nginx's
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn, conn.makefile("rb") as reader:
        conn.sendall(b"POST /chat/send HTTP/1.1\r\nHost: glassbox\r\n"
                     b"Content-Type: application/x-www-form-urlencoded\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body)
        status, text = read_response(reader)
        assert status == 413 and b"too large" in text
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: glassbox\r\n\r\n")
        assert read_response(reader)[0] == 200


def test_the_start_up_line_names_the_address_gunicorn_binds(tmp_path):
    port = free_port()
    log = tmp_path / "gunicorn.log"
    env = {**os.environ, **model_env(tmp_path), "GLASSBOX_INSTANCE_PATH": str(tmp_path / "instance"),
           "GLASSBOX_BIND": "127.0.0.1:1", "PYTHONPATH": str(ROOT)}  # -b on the command line wins over it
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "-b",
                                 f"127.0.0.1:{port}", "wsgi:app"], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: "Glassbox is listening on" in log.read_text(), 60), log.read_text()[-2000:]
    finally:
        proc.terminate()
        proc.wait(30)
    line = next(x for x in log.read_text().splitlines() if "Glassbox is listening on" in x)
    assert f"Glassbox is listening on http://127.0.0.1:{port} on loopback only" in line


@pytest.mark.parametrize("name, value, says", [
    ("GLASSBOX_MAX_BATCH", "0", "GLASSBOX_MAX_BATCH='0' is out of range"),
    ("GLASSBOX_TORCH_THREADS", "100000000", "GLASSBOX_TORCH_THREADS='100000000' is out of range")])
def test_a_nonsense_setting_stops_start_up_with_one_line_before_any_worker(tmp_path, name, value, says):
    """Checked in gunicorn's on_starting hook: it was the right line, under a worker's 20-line traceback."""
    env = {**os.environ, **model_env(tmp_path), "GLASSBOX_INSTANCE_PATH": str(tmp_path / "instance"), name: value,
           "GLASSBOX_BIND": f"127.0.0.1:{free_port()}", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    said = done.stdout + done.stderr
    assert done.returncode == 2, said[-2000:]
    assert f"Glassbox cannot start: {says}" in said and "Traceback" not in said and "Booting worker" not in said
