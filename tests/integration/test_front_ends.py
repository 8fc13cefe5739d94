"""Two real gunicorn front ends on one real PostgreSQL, behind real nginx with deploy/nginx.conf's routing
(each browser to one front end by its session cookie): a browser's conversation moves between them, its
stream and Stop work from either, and one front end killed with -9 mid-reply leaves the other serving
with nothing acknowledged lost. A browser is moved by sending its cookie straight to the other front end."""

from __future__ import annotations

import re
import secrets
import time
import urllib.request

import psycopg
import pytest

from tests.integration.conftest import require_nginx
from tests.integration.helpers import as_sse_text, message_id, read_until, start_reply, streamed_text, wait_saved
from tests.support.servers import Client, Gunicorn, Nginx, model_env, stream_url, wait_until

pytestmark = pytest.mark.integration

PREFIX = "/glassbox"


@pytest.fixture(scope="module")
def fronts(postgres_cluster, tmp_path_factory):
    """Front ends a and b (50 ms a token) on one database, and nginx before both."""
    require_nginx()
    work = tmp_path_factory.mktemp("fronts")
    database = postgres_cluster.new_database()
    env = {**model_env(work, chat_arch="tiny:0.05"), "GLASSBOX_DATABASE_URL": database,
           "GLASSBOX_SECRET_KEY": secrets.token_urlsafe(32)}  # one key: each reads the other's cookies
    a, b = Gunicorn(work / "a", env), Gunicorn(work / "b", env)
    proxy = Nginx(work / "nginx", [a.port, b.port])
    try:
        a.start()
        b.start()
        proxy.start()
        yield a, b, proxy
    finally:
        proxy.stop()
        a.stop()
        b.stop()
        postgres_cluster.drop_database(database)


def on(client: Client, base: str) -> Client:
    """The same browser (its cookie jar, its CSRF token) sending its requests to another address."""
    moved = Client(base)
    moved.jar, moved.csrf = client.jar, client.csrf
    moved.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(client.jar))
    return moved


def read_to_end(client: Client, url: str, timeout: float = 60) -> list:
    return list(client.open_stream(url, timeout=timeout).events())


def running_on(*servers: Gunicorn) -> list[float]:
    return [server.metrics()["glassbox_running_jobs"] for server in servers]


def logged(path: str, *servers: Gunicorn) -> list[int] | None:
    """How many requests for `path` each server logged, once all 3 of them are (the log lags a little)."""
    counts = [server.log().count(path) for server in servers]
    return counts if sum(counts) == 3 else None


def saved_reply(server: Gunicorn, message: int) -> dict:
    with psycopg.connect(server.env["GLASSBOX_DATABASE_URL"]) as db:
        content, status = db.execute("SELECT content, status FROM messages WHERE id = %s", (message,)).fetchone()
    return {"content": content, "status": status}


def conversation_of(url: str) -> str:
    return re.search(r"/chat/c/([0-9a-f]+)/m/", url).group(1)


def test_a_conversation_started_on_one_front_end_is_listed_read_continued_branched_shared_and_deleted_on_the_other(
        fronts):
    a, b, _ = fronts
    on_a = Client(a.url)
    url = start_reply(on_a, tokens=8, content="Hello from a")
    first = read_to_end(on_a, url)
    assert first[-1].name == "done"
    cid, reply_id = conversation_of(url), message_id(url)
    on_b = on(on_a, b.url)
    listed = on_b.get("/chat/")
    assert listed.status == 200 and f"/chat/c/{cid}" in listed.text and "Hello from a" in listed.text
    page = on_b.get(f"/chat/c/{cid}")
    assert page.status == 200 and f'id="message-{reply_id}"' in page.text
    continued = on_b.post("/chat/send", {"content": "And from b", "conversation_id": cid, "max_new_tokens": "8"},
                          htmx=True)
    assert continued.status == 200, continued.text
    assert message_id(stream_url(continued.text)) > reply_id, continued.text
    done = read_to_end(on_b, stream_url(continued.text))
    assert done[-1].name == "done" and "complete" in done[-1].data, done[-1].data
    branched = on_b.post(f"/chat/c/{cid}/m/{reply_id}/branch", {"index": "2", "text": "ok"}, htmx=True)
    assert branched.status == 200, branched.text
    assert read_to_end(on_b, stream_url(branched.text))[-1].name == "done"
    shared = on_b.post(f"/chat/c/{cid}/share")
    token = re.search(r"/chat/shared/([\w-]+)", shared.text).group(1)
    stranger = Client(a.url).get(f"/chat/shared/{token}")  # another browser, on the other front end
    assert stranger.status == 200 and "Hello from a" in stranger.text
    page = on_a.get(f"/chat/c/{cid}")  # everything done on b, read on a
    assert "And from b" not in page.text  # the branch made on b is the version shown
    assert "‹" in page.text or "2/2" in page.text
    assert on_b.post(f"/chat/c/{cid}/delete", htmx=True).status == 204
    assert on_a.get(f"/chat/c/{cid}").status == 404 and Client(b.url).get(f"/chat/shared/{token}").status == 404


def test_a_reply_streams_on_the_front_end_that_does_not_run_it_and_stop_there_stops_it(fronts):
    a, b, _ = fronts
    on_a = Client(a.url)
    url = start_reply(on_a, tokens=250)  # 250 tokens of 50 ms: 12 s unless stopped
    on_b = on(on_a, b.url)
    events, seen, reader = read_until(on_b, url, tokens=2)  # followed from the database on b
    assert seen.wait(15), events
    assert running_on(a, b) == [1, 0]  # the job runs on a, and no subscriber there: still running
    stop = on_b.post(url.replace("/stream", "/stop"), htmx=True)
    assert stop.status == 204
    stopped = time.monotonic()
    reader.join(10)
    assert not reader.is_alive() and events[-1].name == "done" and "stopped" in events[-1].data
    assert time.monotonic() - stopped < 4  # the owner reads the request at its next save (every second)
    assert wait_until(lambda: running_on(a, b) == [0, 0], 5)
    page = on_a.get(f"/chat/c/{conversation_of(url)}")
    assert re.search(rf'<li class="message assistant stopped" id="message-{message_id(url)}"', page.text)
    assert streamed_text(events)  # what b streamed came from what a saved


def test_stop_on_the_front_end_that_runs_it_ends_the_stream_followed_elsewhere(fronts):
    a, b, _ = fronts
    on_b = Client(b.url)
    url = start_reply(on_b, tokens=250)
    on_a = on(on_b, a.url)
    events, seen, reader = read_until(on_a, url, tokens=1)
    assert seen.wait(15), events
    assert on_b.post(url.replace("/stream", "/stop"), htmx=True).status == 204  # where it runs: at once
    reader.join(10)
    assert not reader.is_alive() and events[-1].name == "done" and "stopped" in events[-1].data


def test_through_nginx_each_browser_stays_on_one_front_end_and_both_are_used(fronts):
    a, b, proxy = fronts
    homes = set()
    for i in range(12):
        browser = Client(proxy.url)
        browser.get(f"{PREFIX}/chat/")  # the first visit sets the cookie (and lands anywhere)
        for _ in range(3):
            assert browser.get(f"{PREFIX}/chat/c/probe{i:02d}").status == 404
        logs = wait_until(lambda path=f"/chat/c/probe{i:02d}": logged(path, a, b), 5)
        assert sorted(logs) == [0, 3], logs  # every request of this browser on one front end
        homes.add(logs.index(3))
    assert homes == {0, 1}  # 12 cookies, one front end each: both are used (all on one: 1 in 2048)
    browser = Client(proxy.url)
    url = start_reply(browser, PREFIX, tokens=20)
    events = read_to_end(browser, url)
    assert events[-1].name == "done" and sum(e.name == "token" for e in events) == 20  # token by token: its own


def test_a_front_end_killed_mid_reply_leaves_the_other_serving_with_nothing_acknowledged_lost(fronts):
    a, b, proxy = fronts
    acknowledged = []  # (browser, conversation, text) of every message the server answered 2xx
    browsers = [Client(proxy.url) for _ in range(6)]
    for i, browser in enumerate(browsers):
        url = start_reply(browser, PREFIX, tokens=5, content=f"Question {i}")
        assert read_to_end(browser, url)[-1].name == "done"
        acknowledged.append((browser, conversation_of(url), f"Question {i}"))
    victim = browsers[0]
    url = start_reply(victim, PREFIX, tokens=250, content="A long one")
    acknowledged.append((victim, conversation_of(url), "A long one"))
    events, seen, reader = read_until(victim, url, tokens=40)
    assert seen.wait(30), events
    dead, alive = (a, b) if running_on(a, b) == [1, 0] else (b, a)
    assert running_on(dead, alive) == [1, 0]
    # PostgreSQL's text holds no NUL: the store keeps one a model writes as U+FFFD
    shown = as_sse_text(streamed_text(list(events))).replace("\x00", "\ufffd")
    wait_saved(lambda: saved_reply(alive, message_id(url))["content"], shown)
    dead.kill_9()
    reader.join(10)
    assert not reader.is_alive()  # the stream broke with its front end
    saved = saved_reply(alive, message_id(url))
    assert saved["status"] == "pending"  # nobody got to say it stopped: it really died
    assert as_sse_text(saved["content"]).startswith(shown) and len(shown) > 0  # what the user saw is kept
    # The browser reopens the stream, as EventSource does: nginx sends it to the front end still up, which
    # follows the reply in the database, sees its front end's lease run out and ends it as stopped.
    again = read_to_end(victim, url, timeout=60)
    assert again[-1].name == "done" and "stopped" in again[-1].data
    assert saved_reply(alive, message_id(url)) == {**saved, "status": "stopped"}
    for browser, conversation, text in acknowledged:
        page = browser.get(f"{PREFIX}/chat/c/{conversation}")
        assert page.status == 200 and text in page.text, text
    for browser in browsers:  # every browser, whichever front end it was on, is served by the other
        url = start_reply(browser, PREFIX, tokens=5, content="Still there?")
        assert read_to_end(browser, url)[-1].name == "done"
    assert alive.proc.poll() is None
