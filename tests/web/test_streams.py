"""One place counts streams: every long-lived response (chat and Loop-lab SSE, paced replays, the NDJSON
API, the no-JavaScript waits) holds a GLASSBOX_MAX_STREAMS slot, frees it on every exit path, and is
refused with 503 + Retry-After while none is free; pages keep answering. Paced replays are bounded."""

from __future__ import annotations

import re
import string
import threading
import time

import pytest

from tests.conftest import csrf_of, make_app, wait_for
from tests.support.chat_models import tiny_chat_model
from tests.support.loop_models import bundle
from webapp.loops.web.traces import REPLAY_MAX_GAP_SECONDS, REPLAY_MAX_SECONDS, replay_frames, replay_schedule
from webapp.web.counts import ClientStreams
from webapp.web.state import glassbox
from webapp.web.streams import open_streams

LETTERS = list(string.ascii_uppercase)
CYCLE = [[a, b] for a, b in zip(LETTERS, LETTERS[1:] + LETTERS[:1])]
HX = {"HX-Request": "true"}


@pytest.fixture
def one_slot(tmp_path):
    models = {"chat": tiny_chat_model(tmp_path / "chat", seconds_per_step=0.02), "loops": bundle(delay=0.02)}
    app = make_app(tmp_path, models, max_streams=1)
    yield app
    glassbox(app).core.shutdown()


def hold_slot(app):
    """Take the one slot with a paced replay of a trace whose loops were recorded 1e300 s apart."""
    client = app.test_client()
    csrf = csrf_of(client, "/loops/")
    trace = client.post("/loops/run", data={"csrf_token": csrf, "src": LETTERS, "dst": LETTERS[1:] + LETTERS[:1],
                                            "start": "A", "steps": "3"}).headers["Location"]
    streaming = client.get(trace + "/replay", buffered=False)
    body = iter(streaming.response)
    next(body)  # open: the replay now holds its thread and the slot
    return client, streaming, body


def refused(response) -> bool:
    return (response.status_code == 503 and response.headers.get("Retry-After") == "5"
            and "Too many open streams" in response.get_data(as_text=True))


def test_every_long_lived_route_is_counted_and_refused_when_no_slot_is_free(one_slot):
    core, streams = glassbox(one_slot).core, open_streams(one_slot)
    holder, streaming, _ = hold_slot(one_slot)
    assert streams.count == 1
    other = one_slot.test_client()
    csrf = csrf_of(other, "/chat/")
    started = time.monotonic()
    assert other.get("/loops/").status_code == 200 and other.get("/chat/").status_code == 200  # pages answer
    assert time.monotonic() - started < 5
    trace = holder.post("/loops/run", data={"csrf_token": csrf_of(holder, "/loops/"), "src": LETTERS,
                                            "dst": LETTERS, "start": "A", "steps": "2"})
    assert refused(trace)  # the no-JS run waits for its run: it needs a slot too
    checks = {
        "replay": holder.get(re.sub(r"/replay$", "", streaming.request.path) + "/replay"),
        "api": other.post("/api/loops/trace", json={"mapping": CYCLE, "start": "A", "steps": 2}),
        "no-js send": other.post("/chat/send", data={"csrf_token": csrf, "content": "hi", "max_new_tokens": "2"}),
    }
    for name, response in checks.items():
        assert refused(response), (name, response.status_code, response.get_data(as_text=True)[:300])
    assert core.counters["submitted"] == 1  # refusals queued nothing (only the run that made the trace)
    assert "/chat/c/" not in other.get("/chat/").get_data(as_text=True)  # and saved nothing
    streaming.close()  # the replay's client hangs up: its slot is free again
    assert wait_for(lambda: streams.count == 0)


def test_slots_are_freed_when_streams_end_and_when_waits_end(one_slot):
    streams = open_streams(one_slot)
    client = one_slot.test_client()
    api = client.post("/api/loops/trace", json={"mapping": CYCLE, "start": "A", "steps": 2})
    assert api.status_code == 200 and api.get_data(as_text=True).count("\n") >= 3
    assert streams.count == 0
    csrf = csrf_of(client, "/chat/")
    sent = client.post("/chat/send", data={"csrf_token": csrf, "content": "hi", "max_new_tokens": "3"})
    assert sent.status_code == 303 and streams.count == 0  # no-JS: waited for the reply, then let go
    live = client.post("/chat/send", data={"csrf_token": csrf, "content": "hi", "max_new_tokens": "3"}, headers=HX)
    url = re.findall(r'sse-connect="([^"]+)"', live.get_data(as_text=True))[-1]
    assert "event: done" in client.get(url).get_data(as_text=True)
    assert streams.count == 0
    # a stream whose client vanished before the body ran still frees its slot when the server closes it
    never_read = client.get(url.replace("/stream", "/stream"), buffered=False)
    never_read.close()
    assert streams.count == 0


def test_a_paced_replay_is_bounded_whatever_the_trace_claims():
    rows = [{"arrival_seconds": t} for t in (0.0, 0.5, 1e300)] + \
           [{"arrival_seconds": 1e300 * (1 + i)} for i in range(1, 100)]  # 100 gaps of 1e300 s
    schedule = replay_schedule(rows)
    assert schedule[:3] == [0.0, 0.5, 0.5 + REPLAY_MAX_GAP_SECONDS]  # a gap of 1e300 s waits one second
    assert max(schedule) == REPLAY_MAX_SECONDS and schedule == sorted(schedule)
    backwards = replay_schedule([{"arrival_seconds": 5.0}, {"arrival_seconds": 1.0}, {"arrival_seconds": 5.2}])
    assert backwards == pytest.approx([1.0, 1.0, 1.2])  # time never runs backwards or pauses twice
    frames = replay_frames([{"arrival_seconds": t} for t in (0.0, 0.001, 0.1, 0.101, 0.5)])
    assert [len(rows) for _, rows in frames] == [2, 2, 1]


def test_a_replay_says_it_is_bounded(one_slot):
    client = one_slot.test_client()
    trace = client.post("/loops/run", data={"csrf_token": csrf_of(client, "/loops/"), "src": LETTERS,
                                            "dst": LETTERS, "start": "A", "steps": "2"}).headers["Location"]
    page = client.get(trace + "?replay=paced").get_data(as_text=True)
    assert "pauses longer than 1 s are shortened" in page and "at most 20 s" in page


def test_a_hostile_replay_ends_within_the_bound(tmp_path):
    """An uploaded trace whose loops claim to be 1e300 s apart replays within REPLAY_MAX_SECONDS."""
    import io
    import json
    app = make_app(tmp_path, {"loops": bundle()})
    try:
        client = app.test_client()
        made = client.post("/loops/run", data={"csrf_token": csrf_of(client, "/loops/"), "src": LETTERS,
                                               "dst": LETTERS, "start": "A", "steps": "3"}).headers["Location"]
        snapshot = client.get(made + ".json").get_json()
        for i, row in enumerate(snapshot["trace"]):
            row["arrival_seconds"] = 1e300 * i
        up = client.post("/loops/traces/upload", content_type="multipart/form-data",
                         data={"csrf_token": csrf_of(client, "/loops/"),
                               "trace": (io.BytesIO(json.dumps(snapshot).encode()), "t.json")})
        assert up.status_code == 303
        started = time.monotonic()
        replay = client.get(up.headers["Location"] + "/replay").get_data(as_text=True)
        assert "event: done" in replay and time.monotonic() - started < 2 * REPLAY_MAX_GAP_SECONDS + 3
    finally:
        glassbox(app).core.shutdown()


def test_concurrent_takers_never_exceed_the_limit(one_slot):
    streams = open_streams(one_slot)
    won, barrier = [], threading.Barrier(8)

    def take():
        barrier.wait()
        won.append(streams.take(1))

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert won.count(True) == 1 and streams.count == 1
    streams.give_back()


def test_one_client_address_cannot_take_every_slot(tmp_path):
    """Streams per address are capped below the total: one hostile browser (or a script that drops its
    cookie) leaves slots to everyone else."""
    app = make_app(tmp_path, {"loops": bundle(delay=0.02)}, max_streams=3, max_streams_per_client=1)
    try:
        first = open_replay(app.test_client(), "127.0.0.9")
        assert first.status_code == 200
        refused = open_replay(app.test_client(), "127.0.0.9")  # the same address, a new cookie jar
        assert refused.status_code == 429
        assert "This address already holds 1 open streams" in refused.get_data(as_text=True)
        other = open_replay(app.test_client(), "127.0.0.10")  # another address still gets a slot
        assert other.status_code == 200
        other.close()
        first.close()
        again = open_replay(app.test_client(), "127.0.0.9")  # its slot was given back
        assert again.status_code == 200
        again.close()
    finally:
        glassbox(app).core.shutdown()


def open_replay(client, address):
    """A paced replay of a fresh trace, from `address`: a long-lived response that holds its slot."""
    csrf = csrf_of(client, "/loops/")
    trace = client.post("/loops/run", data={"csrf_token": csrf, "src": LETTERS, "dst": LETTERS[1:] + LETTERS[:1],
                                            "start": "A", "steps": "3"}).headers["Location"]
    response = client.get(trace + "/replay", buffered=False, environ_base={"REMOTE_ADDR": address})
    if response.status_code == 200:
        next(iter(response.response))
    return response


def test_a_live_stream_refused_for_its_address_says_the_room_is_full_and_how_many_wait(tmp_path):
    """Issue 31: ten colleagues behind one address sat at "Waiting for the model…" with nothing said. A live
    stream past GLASSBOX_MAX_STREAMS_PER_CLIENT says so in its status and asks again later (no `done`)."""
    app = make_app(tmp_path, {"loops": bundle(delay=0.02)}, max_streams=4, max_streams_per_client=1)
    try:
        held = open_replay(app.test_client(), "127.0.0.9")
        assert held.status_code == 200
        streams = []
        for _ in range(2):  # two runs from the same address: their streams wait
            client = app.test_client()
            csrf = csrf_of(client, "/loops/")
            table = {"csrf_token": csrf, "src": LETTERS, "dst": LETTERS[1:] + LETTERS[:1], "start": "A", "steps": "3"}
            started = client.post("/loops/run", data=table, headers={"HX-Request": "true"})
            streams.append((client, re.search(r'sse-connect="([^"]+)"', started.get_data(as_text=True)).group(1)))
        for n, (client, url) in enumerate(streams, start=1):
            answer = client.get(url, environ_base={"REMOTE_ADDR": "127.0.0.9"})
            body = answer.get_data(as_text=True)  # read before the next request: each its own context
            assert answer.status_code == 200 and answer.mimetype == "text/event-stream"
            assert "retry: " in body and "event: position" in body and "event: done" not in body
            assert f"The room is full from your address: {n} waiting" in body
        held.close()  # a slot is free again: the stream now runs to its end
        client, url = streams[0]
        body = client.get(url, environ_base={"REMOTE_ADDR": "127.0.0.9"}).get_data(as_text=True)
        assert "event: done" in body and "room is full" not in body
    finally:
        glassbox(app).core.shutdown()


def test_addresses_refused_once_and_never_back_are_forgotten():
    """The count of waiting streams keeps no entry for an address that stopped asking: a crowd of
    one-off addresses does not grow it without end."""
    streams = ClientStreams()
    wait = ClientStreams.WAITING_SECONDS
    for n in range(100):
        assert streams.waiting(f"10.0.0.{n}", "/loops/stream/x", now=1000.0) == 1
    assert streams.waiting("10.0.1.1", "/a", now=1000.0 + wait / 2) == 1
    assert streams.waiting_addresses() == 101
    assert streams.waiting("10.0.1.1", "/b", now=1001.0 + wait) == 2  # its own /a is recent: still waiting
    assert streams.waiting_addresses() == 1
    streams.arrived("10.0.1.1", "/a")
    streams.arrived("10.0.1.1", "/b")
    assert streams.waiting_addresses() == 0
