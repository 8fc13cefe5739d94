"""A reply that another front end runs (several front ends on one database): its stream here follows the
row that front end saves and ends when the row does; Stop here is recorded for that front end, whose job
reads it as it saves; a job followed from elsewhere is not an orphan. "Another front end" is played by
writing the row as the owning process would (ChatStore.save_progress, finish_reply)."""

from __future__ import annotations

import re
import threading
import time

from tests.chat.web.test_conversations import HX, conversation_id_of, messages, send, store, stream_url
from tests.conftest import csrf_of, sse_events, wait_for
from webapp.chat.decode.types import ReplyStats
from webapp.chat.service import ChatService
from webapp.web.state import glassbox


def pending_reply_run_elsewhere(app, client) -> tuple[str, int]:
    """A conversation of this browser with a pending reply that no job in this process runs."""
    response = send(client, "Hello", htmx=False, max_new_tokens="3", seed="1")
    cid = response.headers["Location"].rsplit("/", 1)[1]
    chat = store(app)
    with chat.db.connect() as db:
        owner = db.execute("SELECT owner FROM conversations WHERE id = ?", (cid,)).fetchone()[0]
    ids = chat.begin_turn(owner, cid, user_text="And then?", branch_from=None, settings={"max_new_tokens": 50},
                          prompt={})
    return cid, ids.reply_id


def elsewhere(*steps) -> threading.Thread:
    """What the owning front end does meanwhile: (seconds to wait, action) in turn, on a thread (the stream
    is read on the test's own, where its request context lives)."""
    def run():
        for wait, action in steps:
            time.sleep(wait)
            action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def read_all(response) -> tuple[list, float]:
    """The stream's events, and how long after the request the stream ended."""
    started = time.monotonic()
    body = "".join(c.decode() if isinstance(c, bytes) else c for c in response.response)
    return sse_events(body), time.monotonic() - started


def test_the_stream_of_a_reply_run_elsewhere_follows_its_saved_text_and_ends_with_the_row(chat_app):
    client = chat_app.test_client()
    cid, reply_id = pending_reply_run_elsewhere(chat_app, client)
    chat = store(chat_app)
    elsewhere((0.5, lambda: chat.save_progress(reply_id, "Once <upon>")),
              (0.5, lambda: chat.save_progress(reply_id, "Once <upon> a time")),
              (0.5, lambda: chat.finish_reply(reply_id, "Once <upon> a time.", "complete", None,
                                              ReplyStats(5, 0.1, 50.0), [])))
    events, took = read_all(client.get(f"/chat/c/{cid}/m/{reply_id}/stream"))
    assert 1.5 <= took < 3, took  # it waited for the owner, and ended soon after the row did
    names = [n for n, _ in events]
    assert names[0] == "running" and names[-1] == "done" and names.count("done") == 1
    assert [d for n, d in events if n == "token"] == ["Once &lt;upon&gt;", " a time", "."]  # escaped, as saved
    assert "Once &lt;upon&gt; a time." in events[-1][1] and "sse-connect" not in events[-1][1]


def test_the_stream_of_a_reply_run_elsewhere_ends_when_it_is_stopped_or_deleted(chat_app):
    client = chat_app.test_client()
    cid, reply_id = pending_reply_run_elsewhere(chat_app, client)
    chat = store(chat_app)
    elsewhere((0.3, lambda: chat.finish_reply(reply_id, "", "stopped", None, ReplyStats(0, None, None))))
    events, took = read_all(client.get(f"/chat/c/{cid}/m/{reply_id}/stream"))
    assert events[-1][0] == "done" and "stopped" in events[-1][1] and took < 2

    def delete():  # deleted while it streams, as another front end may
        with chat.db.transaction() as db:
            db.execute("DELETE FROM messages WHERE id = ?", (reply_id,))

    cid, reply_id = pending_reply_run_elsewhere(chat_app, client)
    elsewhere((0.3, delete))
    events, took = read_all(client.get(f"/chat/c/{cid}/m/{reply_id}/stream"))
    assert events[-1][0] == "done" and took < 2


def test_stop_for_a_reply_run_elsewhere_is_recorded_for_its_front_end(chat_app):
    client = chat_app.test_client()
    cid, reply_id = pending_reply_run_elsewhere(chat_app, client)
    chat = store(chat_app)
    assert not chat.save_progress(reply_id, "So").stop_requested
    csrf = csrf_of(client, f"/chat/c/{cid}")
    assert client.post(f"/chat/c/{cid}/m/{reply_id}/stop", headers={**HX, "X-CSRF-Token": csrf}).status_code == 204
    assert chat.save_progress(reply_id, "So far").stop_requested  # what the owner's next save reads


def test_a_stop_recorded_by_another_front_end_stops_the_job_here_at_its_next_save(slow_chat_app):
    client = slow_chat_app.test_client()
    response = send(client, "Tell me a story", max_new_tokens="200", temperature="0")  # 20 ms a step: 4 s
    cid, html = conversation_id_of(response), response.get_data(as_text=True)
    reply_id = int(re.search(r"/m/(\d+)/stream", stream_url(html)).group(1))
    stream = client.get(stream_url(html))
    chunks = iter(stream.response)
    while "event: token" not in next(chunks).decode():  # it runs
        pass
    elsewhere((0.0, lambda: store(slow_chat_app).request_stop(reply_id)))  # as the front end where Stop was pressed
    events, took = read_all(stream)
    assert events[-1][0] == "done" and took < 2.5, "the job did not read the stop request"
    reply = messages(slow_chat_app, cid)[-1]
    assert reply.status == "stopped" and reply.tokens < 150


def test_a_job_followed_from_another_front_end_is_not_abandoned_as_an_orphan(slow_chat_app):
    client = slow_chat_app.test_client()
    response = send(client, "Tell me a story", max_new_tokens="150", temperature="0")  # >= 3 s; nobody here reads it
    cid, html = conversation_id_of(response), response.get_data(as_text=True)
    reply_id = int(re.search(r"/m/(\d+)/stream", stream_url(html)).group(1))
    job = glassbox(slow_chat_app).service(ChatService).job_for(reply_id)
    job.orphan_seconds = 2.0  # its first save comes within PROGRESS_SECONDS (1 s), before
    store(slow_chat_app).mark_followed(reply_id)  # another front end streams it
    assert wait_for(lambda: messages(slow_chat_app, cid)[-1].status != "pending", timeout=60)
    reply = messages(slow_chat_app, cid)[-1]
    assert reply.status == "complete" and reply.tokens == 150


def test_the_stream_of_a_reply_whose_front_end_died_ends_as_stopped_when_its_lease_runs_out(chat_app):
    client = chat_app.test_client()
    cid, reply_id = pending_reply_run_elsewhere(chat_app, client)
    chat = store(chat_app)
    chat.save_progress(reply_id, "Half a")
    lease_ends = time.time() + 0.5
    with chat.db.transaction() as db:  # its front end saved it last, then died: the lease runs out in 0.5 s
        db.execute("UPDATE messages SET runner = 'dead', lease_until = ? WHERE id = ?", (lease_ends, reply_id))
    elsewhere((4, lambda: chat.finish_reply(reply_id, "Half a", "error", "never ended", ReplyStats(2, None, None))))
    events, took = read_all(client.get(f"/chat/c/{cid}/m/{reply_id}/stream"))
    # not before the lease ran out (counted from when it was set, not from the request), and long before
    # the row's own end at 4 s
    assert time.time() >= lease_ends and took < 2, (time.time() - lease_ends, took)
    assert [d for n, d in events if n == "token"] == ["Half a"] and events[-1][0] == "done"
    assert "stopped" in events[-1][1] and "sse-connect" not in events[-1][1]
    reply = messages(chat_app, cid)[-1]
    assert reply.status == "stopped" and reply.content == "Half a"


def test_the_leases_of_replies_waiting_in_line_are_renewed_while_they_wait(tmp_path, monkeypatch):
    """A queued reply saves nothing; its front end still keeps its lease, so no follower takes it for dead."""
    from tests.conftest import make_app
    from tests.support.chat_models import tiny_chat_model
    monkeypatch.setattr("webapp.chat.leases.LEASE_RENEW_SECONDS", 0.2)
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat", seconds_per_step=0.02)}, max_batch=1)
    try:
        client = app.test_client()
        first = send(client, "One", max_new_tokens="200", temperature="0")
        second = send(client, "Two", max_new_tokens="5", temperature="0")
        waiting = int(re.search(r"/m/(\d+)/stream", stream_url(second.get_data(as_text=True))).group(1))
        chat = store(app)
        with chat.db.transaction() as db:
            db.execute("UPDATE messages SET lease_until = ? WHERE id = ?", (time.time() + 0.3, waiting))
        time.sleep(1.0)
        assert messages(app, conversation_id_of(second))[-1].status == "pending"  # still in line
        assert not chat.reply_progress(waiting).abandoned
        client.get(stream_url(first.get_data(as_text=True))).close()  # the first stops: the row frees
    finally:
        glassbox(app).core.shutdown()


def test_a_stop_recorded_by_another_front_end_stops_a_reply_still_waiting_in_line(tmp_path, monkeypatch):
    """A queued reply saves nothing: its front end reads the request when it renews the leases."""
    from tests.conftest import make_app
    from tests.support.chat_models import tiny_chat_model
    monkeypatch.setattr("webapp.chat.leases.LEASE_RENEW_SECONDS", 0.2)
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat", seconds_per_step=0.02)}, max_batch=1)
    try:
        client = app.test_client()
        first = send(client, "One", max_new_tokens="200", temperature="0")  # >= 4 s on the one row
        second = send(client, "Two", max_new_tokens="5", temperature="0")
        waiting = int(re.search(r"/m/(\d+)/stream", stream_url(second.get_data(as_text=True))).group(1))
        store(app).request_stop(waiting)  # as the front end where Stop was pressed does
        assert wait_for(lambda: messages(app, conversation_id_of(second))[-1].status == "stopped", timeout=2)
        assert messages(app, conversation_id_of(first))[-1].status == "pending"  # it never waited for a row
        client.get(stream_url(first.get_data(as_text=True))).close()
    finally:
        glassbox(app).core.shutdown()
