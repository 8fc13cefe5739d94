"""/healthz, /readyz and /metrics, and the one log line per job."""

from __future__ import annotations

import logging
import re
import threading

from tests.conftest import csrf_of, sse_events, wait_for
from tests.support.loop_models import bundle
from webapp import create_app
from webapp.config import Settings
from webapp.core.metrics import JobMetrics, LatencyHistogram
from webapp.web.state import glassbox


def test_readiness_follows_the_warm_up_and_the_shutdown(tmp_path, monkeypatch):
    from webapp.loops import boot
    gate = threading.Event()
    monkeypatch.setattr(boot, "warm_up", lambda bundle: gate.wait(10))
    settings = Settings(instance_path=str(tmp_path / "instance"), secret_key="test-secret")
    app = create_app(settings, models={"loops": bundle()}, test_config={"TESTING": True})  # does not wait
    client = app.test_client()
    try:
        assert client.get("/healthz").status_code == 200
        warming = client.get("/readyz")
        assert warming.status_code == 503 and warming.get_json()["reason"] == "warming up"
        gate.set()
        assert wait_for(lambda: client.get("/readyz").status_code == 200)
        assert client.get("/readyz").get_json() == {"status": "ready", "models": ["loops"]}
    finally:
        gate.set()
        glassbox(app).core.shutdown()
    stopping = client.get("/readyz")
    assert stopping.status_code == 503 and stopping.get_json()["reason"] == "shutting down"
    assert "glassbox_accepting_jobs 0" in client.get("/metrics").get_data(as_text=True)


def test_metrics_count_jobs_rows_and_requests(loop_app):
    client = loop_app.test_client()
    csrf = csrf_of(client, "/loops/")
    letters = list("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    live = client.post("/loops/run", data={"csrf_token": csrf, "src": letters, "dst": letters, "start": "A",
                                           "steps": "3"}, headers={"HX-Request": "true"})
    url = re.search(r'sse-connect="([^"]+)"', live.get_data(as_text=True)).group(1)
    assert sse_events(client.get(url).get_data(as_text=True))[-1][0] == "done"
    text = client.get("/metrics").get_data(as_text=True)
    assert 'glassbox_jobs_total{outcome="submitted"} 1' in text and 'glassbox_jobs_total{outcome="done"} 1' in text
    assert 'glassbox_jobs_finished_total{kind="loops",outcome="done"} 1' in text
    assert "glassbox_loop_rows_total 3" in text and "glassbox_job_run_seconds_count 1" in text
    assert re.search(r"glassbox_request_seconds_count [1-9]", text)  # streams are left out of it
    assert 'glassbox_model_warmup_seconds{model="loops"}' in text and "glassbox_open_streams 0" in text


class FakeJob:
    id, seq, kind, state, error = "abc", 7, "chat", "cancelled", None
    created, started, finished = 10.0, 10.5, 12.0
    counts = {"tokens": 42}
    prompt = "the secret message text"


def test_one_log_line_per_job_with_figures_and_no_text(caplog):
    metrics = JobMetrics()
    with caplog.at_level(logging.INFO, logger="glassbox.jobs"):
        metrics.job_finished(FakeJob())
    [line] = caplog.messages
    assert line == "job id=abc seq=7 kind=chat outcome=cancelled wait_ms=500 run_ms=1500 tokens=42"
    never_started = FakeJob()
    never_started.started, never_started.counts = None, {}
    with caplog.at_level(logging.INFO, logger="glassbox.jobs"):
        metrics.job_finished(never_started)
    assert caplog.messages[-1].endswith("wait_ms=2000 run_ms=- produced=0")
    lines = "\n".join(metrics.lines())
    assert 'glassbox_jobs_finished_total{kind="chat",outcome="cancelled"} 2' in lines
    assert "glassbox_job_run_seconds_count 1" in lines and "glassbox_job_queue_seconds_count 2" in lines


def test_histogram_buckets_are_cumulative():
    histogram = LatencyHistogram((0.1, 1.0))
    for seconds in (0.05, 0.5, 0.5, 5.0):
        histogram.observe(seconds)
    assert histogram.lines("h")[-5:] == ['h_bucket{le="0.1"} 1', 'h_bucket{le="1.0"} 3', 'h_bucket{le="+Inf"} 4',
                                         "h_sum 6.050000", "h_count 4"]


def test_metrics_describe_the_batched_steps_and_the_kv_cache(chat_app):
    client = chat_app.test_client()
    csrf = csrf_of(client, "/chat/")
    for text in ("first", "second"):
        sent = client.post("/chat/send", data={"csrf_token": csrf, "content": text, "max_new_tokens": "4",
                                               "temperature": "0"}, headers={"HX-Request": "true"})
        html = sent.get_data(as_text=True)
        found = re.search(r'sse-connect="([^"]+)"', html)
        if found:
            assert sse_events(client.get(found.group(1)).get_data(as_text=True))[-1][0] == "done"
        else:  # a 4-token reply can finish before its page is rendered: shown whole, with no stream
            assert re.search(r'class="message assistant[^"]*\bcomplete\b', html), html[:600]
    metrics = client.get("/metrics").get_data(as_text=True)
    value = lambda name: float(re.search(rf"^{name} (\S+)$", metrics, re.M).group(1))  # noqa: E731
    assert value("glassbox_batch_admitted_total") == 2 and value("glassbox_batch_retired_total") == 2
    assert value("glassbox_batch_rows_count") >= 1  # decoding steps (a reply's first token comes from its prefill)
    assert value("glassbox_step_seconds_count") >= value("glassbox_batch_rows_count")
    assert value("glassbox_step_prefill_tokens_sum") > 0
    assert value("glassbox_kv_cache_bytes") > 0  # the finished replies' caches, kept for a next turn
    assert value("glassbox_running_jobs") == 0
    # where the worker's time went, for bench.serving.concurrency's served-against-step profile
    for phase in ("prefill", "decode", "publish", "step other", "finish", "admit", "waiting"):
        assert value(f'glassbox_worker_seconds_total{{phase="{phase}"}}') > 0, phase
