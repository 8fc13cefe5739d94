"""Follow links on a real server (issue 31): 20 followers of a presenter's conversation on gunicorn each get
the reply the presenter gets, token by token, soon after the presenter; a late joiner gets the whole reply;
revoking ends every stream and the link then answers 404."""

from __future__ import annotations

import re
import statistics
import threading

import psycopg
import pytest

from tests.integration.helpers import message_id, saved_message, start_reply, streamed_text
from tests.integration.test_front_ends import fronts  # noqa: F401  (the two front ends on PostgreSQL)
from tests.support.servers import Client, Gunicorn, model_env, stream_url, wait_until

pytestmark = pytest.mark.integration

FOLLOWERS = 20


def follow(client: Client, url: str, events: list, started: threading.Event) -> threading.Thread:
    def read():
        stream = client.open_stream(url, timeout=60)
        assert stream.status == 200
        for event in stream.events():
            events.append(event)
            started.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


def test_twenty_followers_get_the_reply_live_a_late_joiner_all_of_it_and_revoke_ends_them(tmp_path):
    env = {**model_env(tmp_path, chat_arch="tiny:0.05"), "GLASSBOX_MAX_STREAMS": "40",
           "GLASSBOX_MAX_STREAMS_PER_CLIENT": "0", "GLASSBOX_HEARTBEAT_SECONDS": "0.5"}
    server = Gunicorn(tmp_path / "instance", env).start()
    try:
        presenter = Client(server.url)
        first = start_reply(presenter, tokens=3, content="Hello")
        list(presenter.open_stream(first).events())
        cid = re.search(r"/chat/c/([^/]+)/m/", first).group(1)
        page = presenter.post(f"/chat/c/{cid}/present")
        assert page.status == 200, page.text
        link = re.search(r'value="http://[^"]+?(/follow/[A-Za-z0-9_-]+)"', page.text).group(1)

        logs = [[] for _ in range(FOLLOWERS)]
        opened = [threading.Event() for _ in range(FOLLOWERS)]
        readers = [follow(Client(server.url), link + "/events", logs[i], opened[i]) for i in range(FOLLOWERS)]
        assert all(e.wait(30) for e in opened)  # each has the conversation as it stands

        reply = presenter.post("/chat/send", {"content": "Tell me a story", "max_new_tokens": "40",
                                              "conversation_id": cid}, htmx=True)
        url = stream_url(reply.text)
        mine = list(presenter.open_stream(url).events())
        own = [e for e in mine if e.name == "token"]
        saved = saved_message(server.instance, message_id(url))
        assert saved["status"] == "complete" and streamed_text(own) == saved["content"].replace("\r", "\n")

        got_all = wait_until(lambda: all(len([e for e in log if e.name == "token"]) >= len(own) for log in logs), 30)
        assert got_all, ([e.name for e in logs[0]], len(own), server.log()[-3000:])
        delays = []
        for log in logs:
            tokens = [e for e in log if e.name == "token"]
            assert streamed_text(tokens) == streamed_text(own)  # every follower's text is the saved reply
            delays += [theirs.at - ours.at for theirs, ours in zip(tokens, own)]
        p95 = statistics.quantiles(delays, n=20)[-1]
        print(f"{FOLLOWERS} followers, {len(own)} tokens: delay after the presenter p50 "
              f"{statistics.median(delays) * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms")
        assert p95 <= 0.25

        # a late joiner, mid-reply: the branch shown, then the whole reply
        third = presenter.post("/chat/send", {"content": "Another one", "max_new_tokens": "40",
                                              "conversation_id": cid}, htmx=True)
        third_url = stream_url(third.text)
        mine = []
        presenting = follow(presenter, third_url, mine, threading.Event())
        assert wait_until(lambda: sum(e.name == "token" for e in mine) >= 10, 30)
        late, late_open = [], threading.Event()
        late_reader = follow(Client(server.url), link + "/events", late, late_open)
        presenting.join(30)
        saved = saved_message(server.instance, message_id(third_url))
        assert wait_until(lambda: streamed_text([e for e in late if e.name == "token"])
                          == saved["content"].replace("\r", "\n"), 30)

        presenter.post(f"/chat/c/{cid}/unpresent")
        for reader in [*readers, late_reader]:
            reader.join(10)
            assert not reader.is_alive()
        assert all(log[-1].name == "done" for log in [*logs, late])
        assert Client(server.url).get(link).status == 404
        assert Client(server.url).get(link + "/events").status == 404
    finally:
        server.stop()


def test_a_follower_on_the_other_front_end_follows_the_database(fronts):  # noqa: F811
    """PostgreSQL, two front ends: the presenter on a, a follower on b gets the new message and the whole
    reply (read from what a saves, as cross-front streams do), and revoking on a ends b's stream."""
    a, b, _proxy = fronts
    presenter = Client(a.url)
    first = start_reply(presenter, tokens=3, content="Hello")
    list(presenter.open_stream(first).events())
    cid = re.search(r"/chat/c/([^/]+)/m/", first).group(1)
    page = presenter.post(f"/chat/c/{cid}/present")
    link = re.search(r'value="http://[^"]+?(/follow/[A-Za-z0-9_-]+)"', page.text).group(1)
    log, opened = [], threading.Event()
    reader = follow(Client(b.url), link + "/events", log, opened)
    assert opened.wait(30)
    reply = presenter.post("/chat/send", {"content": "Across front ends", "max_new_tokens": "40",
                                          "conversation_id": cid}, htmx=True)
    url = stream_url(reply.text)
    list(presenter.open_stream(url).events())
    with psycopg.connect(fronts_database(a)) as db:
        saved = db.execute("SELECT content FROM messages WHERE id = %s", (message_id(url),)).fetchone()[0]
    assert wait_until(lambda: streamed_text([e for e in log if e.name == "token"]) == saved.replace("\r", "\n"), 30)
    assert wait_until(lambda: any("Across front ends" in e.data for e in log if e.name == "conversation"), 10)
    presenter.post(f"/chat/c/{cid}/unpresent")
    reader.join(10)
    assert not reader.is_alive() and log[-1].name == "done"
    assert Client(b.url).get(link).status == 404


def fronts_database(server: Gunicorn) -> str:
    return server.env["GLASSBOX_DATABASE_URL"]


def test_through_nginx_a_follower_gets_the_reply_spread_over_its_generation(stack):
    """deploy/nginx.conf passes /follow/<token>/events unbuffered: tokens arrive as they are written."""
    _app, proxy = stack
    presenter = Client(proxy.url + "/glassbox")
    first = start_reply(presenter, "", tokens=3, content="Hello")
    list(presenter.open_stream(first).events())
    cid = re.search(r"/chat/c/([^/]+)/m/", first).group(1)
    page = presenter.post(f"/chat/c/{cid}/present")
    link = re.search(r'value="http://[^"]+?(/glassbox/follow/[A-Za-z0-9_-]+)"', page.text).group(1)
    log, opened = [], threading.Event()
    reader = follow(Client(proxy.url + "/glassbox"), link + "/events", log, opened)
    assert opened.wait(30)
    reply = presenter.post("/chat/send", {"content": "Through the proxy", "max_new_tokens": "40",
                                          "conversation_id": cid}, htmx=True)
    own = [e for e in presenter.open_stream(stream_url(reply.text)).events() if e.name == "token"]
    assert wait_until(lambda: sum(e.name == "token" for e in log) >= len(own), 30)
    tokens = [e for e in log if e.name == "token"]
    assert streamed_text(tokens) == streamed_text(own)
    assert tokens[-1].at - tokens[0].at >= 0.5 * (len(own) - 1) * 0.05  # spread out, not one burst at the end
    presenter.post(f"/chat/c/{cid}/unpresent")
    reader.join(10)
    assert not reader.is_alive()
