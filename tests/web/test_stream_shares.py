"""Replays of saved traces, non-streamed /v1 calls and Inside reports being worked out share
GLASSBOX_MAX_BULK_STREAMS of the stream slots (webapp/web/streams.py): a flood of them is refused (503 +
Retry-After) while live replies, the browser's streams and streamed /v1 calls, still get a slot (issue 25,
item 4)."""

from __future__ import annotations

import re
import string
import threading

import pytest

from tests.conftest import csrf_of, make_app, wait_for
from tests.support.chat_models import tiny_chat_model
from tests.support.loop_models import bundle
from webapp.web.state import glassbox
from webapp.web.streams import BULK_FULL, open_streams

LETTERS = list(string.ascii_uppercase)
HX = {"HX-Request": "true"}
TOTAL, BULK = 4, 2


@pytest.fixture
def shared(tmp_path):
    models = {"chat": tiny_chat_model(tmp_path / "chat", seconds_per_step=0.02), "loops": bundle(delay=0.01)}
    app = make_app(tmp_path, models, max_streams=TOTAL, max_bulk_streams=BULK, max_streams_per_client=0,
                   max_jobs_per_owner=50, max_jobs_per_client=50, max_new_sessions_per_minute=0)
    yield app
    glassbox(app).core.shutdown()


def open_replay(app, address: str):
    """A paced replay of a fresh trace, held open (its first chunk read), from `address`."""
    client = app.test_client()
    trace = client.post("/loops/run", data={"csrf_token": csrf_of(client, "/loops/"), "src": LETTERS,
                                            "dst": LETTERS[1:] + LETTERS[:1], "start": "A", "steps": "40"},
                        environ_base={"REMOTE_ADDR": address}).headers["Location"]
    response = client.get(trace + "/replay", buffered=False, environ_base={"REMOTE_ADDR": address})
    if response.status_code == 200:
        next(iter(response.response))
    return response


def live_reply(app, address: str = "10.0.0.50"):
    """A chat reply's live stream, as htmx opens it."""
    client = app.test_client()
    sent = client.post("/chat/send", headers=HX, environ_base={"REMOTE_ADDR": address},
                       data={"csrf_token": csrf_of(client, "/chat/"), "content": "hi", "max_new_tokens": "3"})
    url = re.findall(r'sse-connect="([^"]+)"', sent.get_data(as_text=True))[-1]
    return client.get(url, environ_base={"REMOTE_ADDR": address})


def bulk_refused(response) -> bool:
    text = response.get_data(as_text=True)
    return response.status_code == 503 and response.headers.get("Retry-After") == "5" and (
        "replays and whole-reply API calls" in text)


def test_replays_fill_their_share_and_a_live_reply_still_gets_a_slot(shared):
    streams = open_streams(shared)
    held = [open_replay(shared, f"10.0.0.{i}") for i in range(BULK)]
    assert [r.status_code for r in held] == [200] * BULK and streams.count == BULK
    for i in range(TOTAL - BULK):  # as many more as would take every slot left
        extra = open_replay(shared, f"10.0.0.{10 + i}")
        assert bulk_refused(extra), (extra.status_code, extra.get_data(as_text=True)[:300])
        assert BULK_FULL.split(";")[0] in extra.get_data(as_text=True)
    assert streams.count == BULK  # the refusals gave back what they took
    live = live_reply(shared)
    assert live.status_code == 200 and "event: done" in live.get_data(as_text=True)
    for response in reversed(held):  # the test client's streams hold request contexts: last in, first out
        response.close()
    assert wait_for(lambda: streams.count == 0)
    again = open_replay(shared, "10.0.0.9")  # the share was given back
    assert again.status_code == 200
    again.close()


def test_an_inside_report_being_worked_out_takes_the_bulk_share(shared):
    """Inside waits for its job (up to GLASSBOX_INSIDE_WAIT_SECONDS) holding a slot: a bulk one."""
    client = shared.test_client()
    sent = client.post("/chat/send", headers=HX, data={"csrf_token": csrf_of(client, "/chat/"), "content": "hi",
                                                       "max_new_tokens": "3"})
    url = re.findall(r'sse-connect="([^"]+)"', sent.get_data(as_text=True))[-1]
    assert "event: done" in client.get(url).get_data(as_text=True)
    inside = re.sub(r"/stream$", "/inside/1.json", url)
    held = [open_replay(shared, f"10.0.2.{i}") for i in range(BULK)]
    refused = client.get(inside)
    assert refused.status_code == 503 and "replays and whole-reply API calls" in refused.get_data(as_text=True)
    assert live_reply(shared).status_code == 200
    for response in reversed(held):
        response.close()
    assert wait_for(lambda: open_streams(shared).count == 0)
    assert client.get(inside).status_code == 200


def test_whole_v1_replies_fill_their_share_and_live_replies_still_get_slots(shared):
    streams = open_streams(shared)
    body = {"model": "glassbox", "prompt": "Once", "max_tokens": 100}  # 2 s each at 20 ms a token
    answers: list[int] = []

    def whole(address: str) -> None:
        client = shared.test_client(use_cookies=False)
        answers.append(client.post("/v1/completions", json=body, environ_base={"REMOTE_ADDR": address}).status_code)

    callers = [threading.Thread(target=whole, args=(f"10.0.1.{i}",)) for i in range(BULK)]
    for caller in callers:
        caller.start()
    assert wait_for(lambda: streams.count == BULK, 5)
    client = shared.test_client(use_cookies=False)
    extra = client.post("/v1/completions", json=body, environ_base={"REMOTE_ADDR": "10.0.1.9"})
    assert extra.status_code == 503 and extra.headers["Retry-After"] == "5"
    assert "replays and whole-reply API calls" in extra.get_json()["error"]["message"]
    streamed = client.post("/v1/completions", json={**body, "max_tokens": 3, "stream": True},
                           environ_base={"REMOTE_ADDR": "10.0.1.10"})  # a streamed call is live
    assert streamed.status_code == 200 and "[DONE]" in streamed.get_data(as_text=True)
    assert live_reply(shared).status_code == 200
    for caller in callers:
        caller.join(30)
    assert answers == [200] * BULK and streams.count == 0


def test_live_replies_may_use_every_slot(tmp_path):
    """The share bounds bulk responses only: live ones are limited by GLASSBOX_MAX_STREAMS alone."""
    app = make_app(tmp_path, {"loops": bundle(delay=0.05)}, max_streams=TOTAL, max_bulk_streams=BULK,
                   max_streams_per_client=0, max_jobs_per_owner=50, max_jobs_per_client=50)
    try:
        client = app.test_client()
        csrf = csrf_of(client, "/loops/")
        streams = []
        for _ in range(TOTAL):
            live = client.post("/loops/run", headers=HX, data={"csrf_token": csrf, "src": LETTERS,
                                                               "dst": LETTERS, "start": "A", "steps": "60"})
            url = re.findall(r'sse-connect="([^"]+)"', live.get_data(as_text=True))[-1]
            stream = client.get(url, buffered=False)
            assert stream.status_code == 200
            next(iter(stream.response))
            streams.append(stream)
        assert open_streams(app).count == TOTAL
        for stream in reversed(streams):
            stream.close()
    finally:
        glassbox(app).core.shutdown()


def test_when_every_bulk_slot_is_held_a_few_wait_for_one_and_the_rest_are_refused_at_once():
    import threading

    from webapp.web.counts import BulkShare
    share = BulkShare()
    assert share.take(2) and share.take(2)
    assert not share.take(2)  # no wait asked: refused at once
    waited, started = [], threading.Event()

    def waiter():
        started.set()
        waited.append(share.take(2, wait=30))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert started.wait(10)
    assert wait_for(lambda: share.waiting == 1)
    assert not share.take(2, wait=30)  # one waiter is all two slots allow: refused at once, not after 30 s
    share.give_back()
    thread.join(10)
    assert waited == [True] and share.held == 2 and share.waiting == 0
    assert not share.take(2, wait=0.05)  # nobody gives one back: refused when the wait runs out
