"""Through real nginx with deploy/nginx.conf, at the sub-path /glassbox/: streams arrive as they are
generated, a closed tab cancels its job, headers and limits hold, and every URL lives under the prefix."""

from __future__ import annotations

import re
import time

import pytest

from tests.integration.helpers import message_id, saved_message, start_reply, start_run
from tests.support.servers import Client, stream_url, wait_until
from webapp.web.pages import TOO_LARGE_FOR_PROXY

pytestmark = pytest.mark.integration

PREFIX = "/glassbox"


def test_sse_events_arrive_spread_over_the_generation_not_in_one_burst(stack):
    app, proxy = stack
    client = Client(proxy.url)
    stream = client.open_stream(start_reply(client, PREFIX, tokens=60))
    assert stream.status == 200 and stream.headers["Content-Type"].startswith("text/event-stream")
    assert "Content-Encoding" not in stream.headers  # never gzipped
    events = list(stream.events())
    assert events[-1].name == "done"
    tokens = [e.at for e in events if e.name == "token"]
    assert len(tokens) >= 10
    # 60 steps of >= 50 ms each: at least 3 s of generation. Buffered by nginx, every event would
    # arrive within a few milliseconds at the end; streamed, they cover most of the generation.
    assert tokens[-1] - tokens[0] > 1.5
    gaps = [b - a for a, b in zip(tokens, tokens[1:])]
    assert sum(1 for gap in gaps if gap > 0.02) >= len(gaps) // 2


def test_closing_the_client_cancels_its_job_within_a_second(stack):
    app, proxy = stack
    client = Client(proxy.url)
    url = start_reply(client, PREFIX, tokens=250)  # 250 steps of 50 ms: 12 s if nobody stopped it
    before = app.metrics()['glassbox_jobs_total{outcome="cancelled"}']
    stream = client.open_stream(url)
    seen = 0
    for event in stream.events():
        seen += event.name == "token"
        if seen == 5:
            break
    stream.close()
    closed = time.monotonic()
    cancelled = wait_until(lambda: app.metrics()['glassbox_jobs_total{outcome="cancelled"}'] > before, 5, 0.02)
    elapsed = time.monotonic() - closed
    assert cancelled, "the job was not cancelled"
    assert elapsed < 1.0, f"cancelled {elapsed:.2f} s after the client left"
    saved = saved_message(app.instance, message_id(url))
    assert saved["status"] == "stopped" and 5 <= saved["tokens"] < 250 and saved["content"]
    assert app.metrics()["glassbox_running_jobs"] == 0


def test_the_apps_security_headers_pass_through_and_buffering_hints_do_not(stack):
    app, proxy = stack
    direct, proxied = Client(app.url).get("/chat/"), Client(proxy.url).get(f"{PREFIX}/chat/")
    for name in ("Content-Security-Policy", "X-Content-Type-Options", "Referrer-Policy", "X-Frame-Options"):
        assert proxied.headers[name] == direct.headers[name]
    assert "frame-ancestors 'none'" in proxied.headers["Content-Security-Policy"]
    assert "nginx/" not in proxied.headers.get("Server", "")  # server_tokens off


def test_request_bodies_are_limited_by_the_app_with_its_own_message(stack):
    app, proxy = stack
    client = Client(proxy.url)
    client.get(f"{PREFIX}/chat/")
    too_big = client.post(f"{PREFIX}/chat/send", {"content": "x" * 300_000}, htmx=True)
    assert too_big.status == 413
    assert "too large" in too_big.text
    huge = client.post(f"{PREFIX}/chat/send", {"content": "x" * 2_000_000})
    assert huge.status == 413  # nginx's own limit, before gunicorn reads a byte
    assert TOO_LARGE_FOR_PROXY in huge.text  # yet said in the app's words, on the app's page
    assert "<html" in huge.text and "nginx" not in huge.text


def test_the_loop_editor_refuses_a_flood_in_nginx_and_a_near_miss_in_the_app(stack):
    app, proxy = stack
    client = Client(proxy.url)
    client.get(f"{PREFIX}/loops/")
    pairs = {"src": ["A"] * 10_000, "dst": ["B"] * 10_000, "start": "A", "steps": "8", "action": "shuffle"}
    flood = client.post(f"{PREFIX}/loops/editor", pairs, htmx=True)  # ~200 KB: refused by nginx unread
    assert flood.status == 413
    assert TOO_LARGE_FOR_PROXY in flood.text and "<html" not in flood.text  # the htmx fragment
    assert flood.headers.get("HX-Retarget") == "#flash"
    near = {**pairs, "src": ["A"] * 1_600, "dst": ["B"] * 1_600}  # ~20 KB: the app's own limit, with its figure
    answer = client.post(f"{PREFIX}/loops/editor", near, htmx=True)
    assert answer.status == 413 and "16 KiB" in answer.text
    assert client.post(f"{PREFIX}/loops/editor", {"start": "A", "steps": "8", "action": "shuffle"},
                       htmx=True).status == 200


def urls_in(html: str) -> list[str]:
    return re.findall(r'(?:href|src|action|hx-post|sse-connect)="([^"]+)"', html)


def assert_all_under_prefix(html: str) -> list[str]:
    local = [u for u in urls_in(html) if u.startswith("/")]
    assert local, "no links found"
    outside = [u for u in local if not u.startswith(PREFIX + "/")]
    assert not outside, f"URLs outside {PREFIX}/: {outside}"
    return local


def test_the_app_lives_under_the_sub_path(stack):
    app, proxy = stack
    client = Client(proxy.url)
    home = client.get(PREFIX)  # redirected to /glassbox/
    assert home.status == 200 and home.url.endswith(f"{PREFIX}/")
    assert_all_under_prefix(home.text)  # links, forms (the theme switch posts) and scripts
    for url in set(re.findall(r'(?:href|src)="(/[^"]+)"', home.text)):
        assert client.get(url).status == 200, url  # pages, the stylesheet, scripts, favicon

    # Chat: the htmx fragment, its stream URL and the pushed URL are all under the prefix.
    client.get(f"{PREFIX}/chat/")
    sent = client.post(f"{PREFIX}/chat/send", {"content": "hi", "max_new_tokens": "3"}, htmx=True)
    assert_all_under_prefix(sent.text)
    assert sent.headers["HX-Push-Url"].startswith(f"{PREFIX}/chat/c/")
    events = list(client.open_stream(stream_url(sent.text)).events())
    assert events[-1].name == "done"
    assert_all_under_prefix(events[-1].data)
    # Without JavaScript the form redirects to the conversation, under the prefix.
    plain = client.post(f"{PREFIX}/chat/send", {"content": "hi", "max_new_tokens": "3"})
    assert plain.status == 200 and re.search(rf"{PREFIX}/chat/c/\w+$", plain.url)
    assert_all_under_prefix(plain.text)

    # Loop lab: run, stream rows, then the permalink of the saved trace.
    url = start_run(client, PREFIX, steps=4)
    assert url.startswith(f"{PREFIX}/loops/jobs/")
    events = list(client.open_stream(url).events())
    assert "".join(e.data for e in events if e.name == "rows").count("<tr") == 4 and events[-1].name == "done"
    links = assert_all_under_prefix(events[-1].data)
    permalink = next(u for u in links if re.fullmatch(rf"{PREFIX}/loops/traces/\w+", u))
    assert client.get(permalink).status == 200

    missing = client.get(f"{PREFIX}/no/such/page")
    assert missing.status == 404 and f'href="{PREFIX}/"' in missing.text
