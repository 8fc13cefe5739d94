"""Limits a script cannot shed by dropping its cookie: jobs and new sessions per client address (the
address as a trusted proxy reports it), and a fair queue, round-robin across clients."""

from __future__ import annotations

import string
import threading

import pytest

from tests.conftest import csrf_of, make_app, wait_for
from tests.support.chat_models import tiny_chat_model
from tests.support.executors import FunctionJobs
from tests.support.loop_models import bundle
from webapp.core import InferenceCore, Job
from webapp.web.counts import NEW_SESSIONS_FULL
from webapp.web.state import glassbox

LETTERS = list(string.ascii_uppercase)
CYCLE = [[a, b] for a, b in zip(LETTERS, LETTERS[1:] + LETTERS[:1])]


@pytest.fixture
def app(tmp_path, request):
    models = {"chat": tiny_chat_model(tmp_path / "chat", seconds_per_step=0.02), "loops": bundle(delay=0.05)}
    app = make_app(tmp_path, models, **getattr(request, "param", {}))
    yield app
    glassbox(app).core.shutdown()


def run_from(app, address, proxy_says=None):
    """A Loop-lab run (htmx: it is queued, the answer comes at once) from a brand-new browser, as a
    script that drops its cookie would send it, from `address` (maybe through a proxy)."""
    client = app.test_client()
    extra = {"environ_base": {"REMOTE_ADDR": address},
             "headers": {"HX-Request": "true", **({"X-Forwarded-For": proxy_says} if proxy_says else {})}}
    csrf = csrf_of(client, "/loops/") if not proxy_says else None
    if proxy_says:
        page = client.get("/loops/", **extra).get_data(as_text=True)
        csrf = page.split('name="csrf_token" value="')[1].split('"')[0]
    return client.post("/loops/run", data={"csrf_token": csrf, "src": LETTERS, "dst": LETTERS, "start": "A",
                                           "steps": "40"}, **extra)


@pytest.mark.parametrize("app", [{"max_jobs_per_client": 2, "max_jobs_per_owner": 4}], indirect=True)
def test_jobs_per_address_hold_whatever_cookies_a_script_sends(app):
    for _ in range(2):  # a fresh browser each time: a new owner every call
        assert run_from(app, "198.51.100.7").status_code == 200
    third = run_from(app, "198.51.100.7")
    assert third.status_code == 429 and "from your address" in third.get_data(as_text=True)
    api = app.test_client().post("/api/loops/trace", json={"mapping": CYCLE, "start": "A", "steps": 2},
                                 environ_base={"REMOTE_ADDR": "198.51.100.7"})
    assert api.status_code == 429 and "keep the session cookie" in api.get_json()["error"]
    # another address is not held up; nor is a browser behind the proxy, counted by its own address
    assert run_from(app, "198.51.100.8").status_code == 200
    assert run_from(app, "", proxy_says="10.9.8.7").status_code == 200  # nginx, on gunicorn's Unix socket
    # ... while a client that is not a trusted proxy cannot claim to be someone else
    assert run_from(app, "198.51.100.7", proxy_says="10.1.1.1").status_code == 429


@pytest.mark.parametrize("app", [{"max_new_sessions_per_minute": 3}], indirect=True)
def test_new_sessions_per_address_are_limited(app):
    for _ in range(3):
        assert app.test_client().get("/chat/", environ_base={"REMOTE_ADDR": "203.0.113.9"}).status_code == 200
    fourth = app.test_client().get("/chat/", environ_base={"REMOTE_ADDR": "203.0.113.9"})
    assert fourth.status_code == 429 and "Too many new sessions from your address" in fourth.get_data(as_text=True)
    # a browser that keeps its cookie is not affected; nor is another address
    keeper = app.test_client()
    keeper.get("/chat/", environ_base={"REMOTE_ADDR": "203.0.113.10"})
    for _ in range(5):
        assert keeper.get("/chat/", environ_base={"REMOTE_ADDR": "203.0.113.10"}).status_code == 200
    assert NEW_SESSIONS_FULL in fourth.get_data(as_text=True).replace("&#39;", "'")


def test_the_queue_is_round_robin_across_clients():
    core = InferenceCore({}, {"t": FunctionJobs()})
    gate, order = threading.Event(), []

    def blocker(job, core):
        gate.wait(5)

    def record(job, core):
        order.append(job.client)

    try:
        first = core.submit(Job("t", "o", blocker, client="busy"))
        first.subscribe  # noqa: B018 (the job is watched below)
        watched = [first]
        assert wait_for(lambda: first.state == "running")
        for _ in range(5):  # one client's burst ...
            watched.append(core.submit(Job("t", "o1", record, client="burst")))
        late = core.submit(Job("t", "o2", record, client="polite"))  # ... then one job from someone else
        watched.append(late)
        assert late.position == 2  # behind one of the burst, not all five
        assert [j.position for j in watched[1:6]] == [1, 3, 4, 5, 6]
        gate.set()
        for job in watched:
            list(job.subscribe(0.05))
        assert order == ["burst", "polite", "burst", "burst", "burst", "burst"]
    finally:
        gate.set()
        core.shutdown(timeout=5)


@pytest.mark.parametrize("app", [{"max_batch": 1}], indirect=True)
def test_a_burst_of_replies_from_one_address_does_not_delay_anothers_first_token(app):
    core = glassbox(app).core
    burst = [app.test_client() for _ in range(4)]
    for client in burst:
        csrf = csrf_of(client, "/chat/")
        sent = client.post("/chat/send", data={"csrf_token": csrf, "content": "hi", "max_new_tokens": "50"},
                           headers={"HX-Request": "true"}, environ_base={"REMOTE_ADDR": "192.0.2.50"})
        assert sent.status_code == 200
    other = app.test_client()
    csrf = csrf_of(other, "/chat/")
    other.post("/chat/send", data={"csrf_token": csrf, "content": "hi", "max_new_tokens": "2"},
               headers={"HX-Request": "true"}, environ_base={"REMOTE_ADDR": "192.0.2.51"})
    waiting = core.scheduler.waiting()  # the scheduler's own view of who is next
    theirs = next(j for j in waiting if j.client == "192.0.2.51")
    assert theirs.position <= 2, [(j.client, j.position) for j in waiting]
