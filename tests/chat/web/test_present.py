"""Follow links and replays at a pace (issue 31), in one process: present, follow, a late joiner, revoke;
replay's pace, its bounds and Stop. The many-followers test on a real server is tests/integration/test_follow.py."""

import re
import threading
import time
from html import unescape

import pytest

from tests.chat.web.test_conversations import HX, conversation_id_of, messages, send, stream_url
from tests.conftest import csrf_of, sse_events, wait_for
from tests.support.follower import Follower
from webapp.web.streams import open_streams


def text_of(fragments: str) -> str:
    return unescape(re.sub(r"<[^>]+>", "", fragments))


def a_reply(client, app, tokens=40):
    """A finished reply of `tokens` tokens (the tiny model may end a reply early: another seed then)."""
    csrf = csrf_of(client, "/chat/")
    for seed in range(30):
        response = send(client, "Count for me", csrf=csrf, seed=str(seed), max_new_tokens=str(tokens))
        client.get(stream_url(response.get_data(as_text=True))).get_data()
        cid = conversation_id_of(response)
        reply = messages(app, cid)[-1]
        if reply.tokens == tokens:
            return cid, reply
    pytest.fail("no seed gave a reply of that length")


def present(client, cid) -> str:
    csrf = csrf_of(client, f"/chat/c/{cid}")
    response = client.post(f"/chat/c/{cid}/present", data={"csrf_token": csrf})
    assert response.status_code == 303
    page = client.get(f"/chat/c/{cid}").get_data(as_text=True)
    return re.search(r'value="http://localhost(/follow/[A-Za-z0-9_-]+)"', page).group(1)


def test_replay_takes_its_pace_and_gives_the_live_streams_events(chat_app):
    client = chat_app.test_client()
    cid, reply = a_reply(client, chat_app)
    started = time.monotonic()
    body = client.get(f"/chat/c/{cid}/m/{reply.id}/replay?pace=10",
                      headers={"Accept": "text/event-stream"}).get_data(as_text=True)
    took = time.monotonic() - started
    assert 4.0 * 0.8 <= took <= 4.0 * 1.2, took
    events = sse_events(body)
    tokens = [d for n, d in events if n == "token"]
    assert len(tokens) == 40 and events[-1][0] == "done" and events[0][0] == "running"
    assert 'class="tok s' in tokens[0]  # shaded by its stored odds, as live
    assert text_of("".join(tokens)) == reply.content


def test_replay_refuses_a_bad_pace_clearly(chat_app):
    client = chat_app.test_client()
    cid, reply = a_reply(client, chat_app, tokens=5)
    for pace in ("0", "-1", "abc", "nan", "1e9", "0.1"):
        response = client.get(f"/chat/c/{cid}/m/{reply.id}/replay?pace={pace}")
        assert response.status_code == 400, pace
        assert "tokens per second" in response.get_data(as_text=True)
    other = chat_app.test_client()  # someone else's reply: not found
    assert other.get(f"/chat/c/{cid}/m/{reply.id}/replay?pace=5").status_code == 404


def test_stop_ends_a_replay_and_frees_its_slot(chat_app):
    client = chat_app.test_client()
    cid, reply = a_reply(client, chat_app)
    response = client.get(f"/chat/c/{cid}/m/{reply.id}/replay?pace=10",
                          headers={"Accept": "text/event-stream"}, buffered=False)
    chunks = iter(response.response)
    first = time.monotonic()
    seen = ""
    while "event: token" not in seen:
        seen += next(chunks).decode()
    assert open_streams(chat_app).count == 1
    response.close()  # Stop: the client closes the stream
    assert time.monotonic() - first < 2.0
    assert wait_for(lambda: open_streams(chat_app).count == 0)


def test_replay_without_javascript_writes_the_page_as_it_goes(chat_app):
    client = chat_app.test_client()
    cid, reply = a_reply(client, chat_app, tokens=5)
    page = client.get(f"/chat/c/{cid}/m/{reply.id}/replay?pace=50").get_data(as_text=True)
    assert "Replay at 50 tokens/s" in page and 'class="tok s' in page
    chat_page = client.get(f"/chat/c/{cid}").get_data(as_text=True)
    assert f'action="/chat/c/{cid}/m/{reply.id}/replay"' in chat_page  # the control under the reply


def test_follower_joins_late_sees_new_turns_live_and_revoke_ends_it(slow_chat_app):
    app, client = slow_chat_app, slow_chat_app.test_client()
    response = send(client, "First", seed="1", max_new_tokens="8")
    client.get(stream_url(response.get_data(as_text=True))).get_data()
    cid = conversation_id_of(response)
    link = present(client, cid)
    follower = app.test_client()  # no cookie of the presenter's
    page = follower.get(link)
    assert page.status_code == 200 and "First" in page.get_data(as_text=True)
    assert 'http-equiv="refresh"' in page.get_data(as_text=True).split("</head>")[0]  # no JavaScript: it reloads

    following = Follower(follower, link + "/events")
    got, reader = following.got, following.reader
    assert wait_for(lambda: "event: conversation" in "".join(got))
    csrf = csrf_of(client, f"/chat/c/{cid}")
    second = send(client, "Second question", csrf=csrf, conversation_id=cid, seed="2", max_new_tokens="30")
    client.get(stream_url(second.get_data(as_text=True))).get_data()
    reply = messages(app, cid)[-1]
    assert wait_for(lambda: reply.content and text_of("".join(
        d for n, d in sse_events("".join(got)) if n == "token")) == reply.content, 10)
    # a late joiner: the whole branch, finished (once the reply is saved as such: its stream can end first)
    assert wait_for(lambda: messages(app, cid)[-1].status == "complete", 10)
    late_stream = app.test_client().get(link + "/events", buffered=False)
    late = ""
    for chunk in late_stream.response:
        late += chunk.decode()
        if "event: conversation" in late:
            break
    late_stream.close()
    shown = [d for n, d in sse_events(late) if n == "conversation"]
    assert "Second question" in shown[0]
    assert f'class="message assistant complete" id="follow-message-{reply.id}"' in shown[0]

    client.post(f"/chat/c/{cid}/unpresent", data={"csrf_token": csrf}, headers=HX)
    reader.join(5)
    assert not reader.is_alive()
    assert sse_events("".join(got))[-1][0] == "done"
    assert follower.get(link).status_code == 404 and follower.get(link + "/events").status_code == 404


def test_presentation_pace_spreads_a_live_reply_to_the_screen(tmp_path):
    from tests.conftest import make_app
    from tests.support.chat_models import tiny_chat_model
    from webapp.web.state import glassbox
    # a model slow enough that the reply is still being written when the stream opens, on a loaded machine too
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat", seconds_per_step=0.1)}, presentation_pace=5.0)
    try:
        client = app.test_client()
        response = send(client, "Slowly", seed="3", max_new_tokens="10")
        opened = time.monotonic()
        stream = client.get(stream_url(response.get_data(as_text=True)), buffered=False)
        stamps = []
        for chunk in stream.response:
            stamps += [time.monotonic()] * chunk.decode().count("event: token")
        reply = messages(app, conversation_id_of(response))[-1]
        assert len(stamps) >= reply.tokens >= 3  # this seed: a few tokens, then the end
        # the screen got one token every 1/5 s (unpaced, the tiny model writes them within milliseconds). Timed
        # from opening the stream: a loaded reader may take tokens late and several at once, never early
        assert stamps[-1] - opened >= (len(stamps) - 1) / 5.0
    finally:
        glassbox(app).core.shutdown()


def test_the_presenters_page_reports_a_replay_to_the_followers(chat_app):
    client = chat_app.test_client()
    cid, reply = a_reply(client, chat_app, tokens=5)
    csrf = csrf_of(client, f"/chat/c/{cid}")
    state = {"view": "replay", "message": str(reply.id), "token": "3"}
    assert client.post(f"/chat/c/{cid}/present/state", data=state, headers={"X-CSRF-Token": csrf}).status_code == 404
    link = present(client, cid)
    assert client.post(f"/chat/c/{cid}/present/state", data=state, headers={"X-CSRF-Token": csrf}).status_code == 204
    assert "The presenter is replaying a reply (token 3)" in chat_app.test_client().get(link).get_data(as_text=True)
    other = chat_app.test_client()  # only the owner reports
    assert other.post(f"/chat/c/{cid}/present/state", data=state,
                      headers={"X-CSRF-Token": csrf_of(other, "/chat/")}).status_code == 404


def test_a_kept_snapshot_whose_live_reply_finished_is_read_again(monkeypatch):
    # a follower who joins just after a reply ended sees it finished, not the snapshot read while it ran
    from webapp.chat.web import present
    monkeypatch.setattr(present, "FOLLOW_POLL_SECONDS", 3600.0)  # kept for as long as the test takes
    reads, made = present.SharedReads(), []

    def fresh():
        made.append(1)
        return present.Snapshot(False, live=5 if len(made) == 1 else None)
    assert reads.read("t", 1, fresh).live == 5
    assert reads.read("t", 1, fresh, finished=lambda message_id: False).live == 5 and len(made) == 1  # kept
    assert reads.read("t", 1, fresh, finished=lambda message_id: message_id == 5).live is None and len(made) == 2


def test_a_room_of_followers_never_takes_the_presenters_streams(tmp_path):
    """Followers have a pool of their own (issue 51: 50 followers took every slot, and the presenter's own reply
    stream answered 503 'Too many open streams'). Here 2 shared slots and 12 followers from 12 addresses."""
    from tests.conftest import make_app
    from tests.support.chat_models import tiny_chat_model
    from webapp.web.state import glassbox
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat")}, max_streams=2, max_follower_streams=20)
    try:
        client = app.test_client()
        cid, _ = a_reply(client, app, tokens=3)
        link = present(client, cid)
        followers = []
        for n in range(12):
            room = app.test_client()
            room.environ_base["REMOTE_ADDR"] = f"10.0.0.{n + 1}"
            followers.append(Follower(room, link + "/events"))
        assert wait_for(lambda: glassbox(app).follower_streams.count == 12)
        assert open_streams(app).count == 0  # none of the shared slots
        sent = send(client, "Still mine", conversation_id=cid, max_new_tokens="4")
        own = client.get(stream_url(sent.get_data(as_text=True)))
        assert own.status_code == 200 and sse_events(own.get_data(as_text=True))[-1][0] == "done"
        client.post(f"/chat/c/{cid}/unpresent", data={"csrf_token": csrf_of(client, f"/chat/c/{cid}")})
        for follower in followers:
            follower.reader.join(5)
        assert wait_for(lambda: glassbox(app).follower_streams.count == 0)
    finally:
        glassbox(app).core.shutdown()


def test_the_last_quarter_of_the_slots_is_kept_for_addresses_that_hold_none():
    """A few addresses holding sockets open cannot lock a fifth person out (issue 51)."""
    from webapp.web.counts import OpenStreams
    streams = OpenStreams()
    held = [streams.take(8, newcomer=False) for _ in range(8)]  # addresses that hold some already
    assert streams.count == 6 and held == [True] * 6 + [False, False]  # 6 of 8: the last 2 kept
    assert streams.take(8, newcomer=True) and streams.take(8, newcomer=True)  # two newcomers still get one
    assert not streams.take(8, newcomer=True)  # and then it is full


def test_the_follow_link_is_given_as_the_room_opens_it_a_qr_code_and_a_short_code(chat_app, tmp_path):
    """The panel names the address people reach the app at (GLASSBOX_PUBLIC_URL), draws it as a QR code and gives a
    short code to type (issue 51: the link read http://127.0.0.1:8000/follow/..., which no colleague could open)."""
    from webapp.present import short_code
    client = chat_app.test_client()
    cid, _ = a_reply(client, chat_app, tokens=3)
    link = present(client, cid)
    page = client.get(f"/chat/c/{cid}").get_data(as_text=True)
    code = short_code(link.rsplit("/", 1)[1])
    assert f"Or type <strong>http://localhost/f/{code}</strong>" in page
    assert '<div class="follow-qr" role="img" aria-label="The follow link as a QR code"><svg' in page
    assert "This address opens on this machine only" in page  # localhost: the room cannot open it
    for typed in (code, code.lower(), code.replace("O", "0").replace("I", "1")):
        found = client.get(f"/f/{typed}")
        assert found.status_code == 303 and found.headers["Location"].endswith(link), typed
    assert client.get("/f/AAAAAA").status_code == 404 and client.get("/f/x").status_code == 404
    client.post(f"/chat/c/{cid}/unpresent", data={"csrf_token": csrf_of(client, f"/chat/c/{cid}")})
    assert client.get(f"/f/{code}").status_code == 404  # revoked with its link

    from tests.conftest import make_app
    from tests.support.chat_models import tiny_chat_model
    from webapp.web.state import glassbox
    room = make_app(tmp_path / "room", {"chat": tiny_chat_model(tmp_path / "chat")},
                    public_url="http://192.168.1.20:8080")
    try:
        presenter = room.test_client()
        cid, _ = a_reply(presenter, room, tokens=3)
        link = present_at(presenter, cid, "http://192.168.1.20:8080")
        page = presenter.get(f"/chat/c/{cid}").get_data(as_text=True)
        assert f'value="http://192.168.1.20:8080{link}"' in page and "opens on this machine only" not in page
    finally:
        glassbox(room).core.shutdown()


def present_at(client, cid: str, origin: str) -> str:
    csrf = csrf_of(client, f"/chat/c/{cid}")
    assert client.post(f"/chat/c/{cid}/present", data={"csrf_token": csrf}).status_code == 303
    page = client.get(f"/chat/c/{cid}").get_data(as_text=True)
    return re.search(r'value="' + re.escape(origin) + r'(/follow/[A-Za-z0-9_-]+)"', page).group(1)


@pytest.mark.parametrize("value", ["192.168.1.20", "http://host/glassbox", "ftp://host", "http://", "http://a b"])
def test_a_public_url_that_is_not_an_origin_stops_start_up_naming_it(value):
    from webapp.config import ConfigError, Settings
    with pytest.raises(ConfigError, match="GLASSBOX_PUBLIC_URL"):
        Settings.from_env({"GLASSBOX_PUBLIC_URL": value})
    assert Settings.from_env({"GLASSBOX_PUBLIC_URL": "https://glassbox.lab.example:8443/"}).public_url


def test_followers_replay_a_reply_on_the_presenters_clock_and_put_it_back_after(chat_app):
    """Issue 51: the presenter's Replay is written on every follower's screen too, token by token, when the
    presenter's own stream writes it (not the whole reply at once); a stale end (an earlier replay's) changes
    nothing, the replay's own end does. How close the two screens keep: bench/serving/follow.py --replay."""
    client = chat_app.test_client()
    cid, reply = a_reply(client, chat_app, tokens=20)
    link = present(client, cid)
    following = Follower(chat_app.test_client(), link + "/events")
    assert wait_for(lambda: "event: conversation" in following.text)
    seen: list[tuple[float, int]] = []  # (when, replay tokens the follower had by then)

    def watch() -> None:
        while not seen or seen[-1][1] < 20:
            seen.append((time.monotonic(), following.text.count("event: replay-token")))
            time.sleep(0.005)

    watching = threading.Thread(target=watch, daemon=True)
    watching.start()
    started = time.monotonic()
    own = client.get(f"/chat/c/{cid}/m/{reply.id}/replay?pace=10&replay=123",
                     headers={"Accept": "text/event-stream"}, buffered=False)
    presenter = sum(chunk.decode().count("event: token") for chunk in own.response)
    assert presenter == 20
    watching.join(10)
    assert seen and seen[-1][1] == 20
    # each follower token is sent when the presenter's stream writes it, token i at (i + 1)/10 s: a loaded
    # reader may see it late, never early
    for when, count in seen:
        assert when - started >= count / 10 - 0.02, (when - started, count)
    events = sse_events(following.text)
    names = [n for n, _ in events]
    assert events[names.index("replay")][1] == str(reply.id)
    replayed = [d for n, d in events if n == "replay-token"]
    assert text_of("".join(replayed)) == reply.content and 'class="tok s' in replayed[0]  # with its odds, as live
    csrf = csrf_of(client, f"/chat/c/{cid}")
    state_url = f"/chat/c/{cid}/present/state"
    assert client.post(state_url, data={"view": "", "ended": "999"}, headers={"X-CSRF-Token": csrf}).status_code == 204
    from tests.chat.web.test_presenter_view import state_of
    assert state_of(chat_app, link)["view"] == "replay"  # an earlier replay's end: this one goes on
    assert client.post(state_url, data={"view": "", "ended": "123"}, headers={"X-CSRF-Token": csrf}).status_code == 204
    assert state_of(chat_app, link)["view"] == ""
    # then the reply whole again, as the presenter's page puts it back
    assert wait_for(lambda: "event: conversation" in following.text[following.text.rindex("event: replay-token"):], 10)
    client.post(f"/chat/c/{cid}/unpresent", data={"csrf_token": csrf})  # the follower's stream ends before the app
    following.reader.join(5)
    assert not following.reader.is_alive()
