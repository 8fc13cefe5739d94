"""Who the per-address limits see, with real gunicorn and real nginx: a client straight to gunicorn's
TCP port is its own address whatever X-Forwarded-For it sends (any local process could send one),
and nginx, on gunicorn's Unix socket as deployed, is believed about each of its clients."""

from __future__ import annotations

import collections
import http.client

import pytest

from tests.integration.conftest import require_nginx
from tests.support.servers import Gunicorn, Nginx, model_env

pytestmark = pytest.mark.integration

NEW_SESSIONS = 30  # GLASSBOX_MAX_NEW_SESSIONS_PER_MINUTE's default


def cookieless_pages(port: int, path: str, source: str, count: int, forwarded: bool) -> collections.Counter:
    """`count` cookie-less page loads from `source`, each with another X-Forwarded-For when asked."""
    statuses: collections.Counter = collections.Counter()
    for n in range(count):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
        try:
            headers = {"X-Forwarded-For": f"10.9.{n // 250}.{n % 250 + 1}"} if forwarded else {}
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            response.read()
            statuses[response.status] += 1
        finally:
            conn.close()
    return statuses


def test_only_the_proxy_on_the_unix_socket_may_say_where_a_request_came_from(tmp_path):
    require_nginx()
    app = Gunicorn(tmp_path / "instance", model_env(tmp_path)).start()
    proxy = Nginx(tmp_path / "nginx", app.port).start()
    try:
        # straight to gunicorn from 127.0.0.1, a new X-Forwarded-For each time: still one address
        direct = cookieless_pages(app.port, "/chat/", "127.0.0.1", NEW_SESSIONS + 5, forwarded=True)
        assert direct == {200: NEW_SESSIONS, 429: 5}, direct
        # through nginx, two clients: each is its own address (the direct flood above did not count)
        for source in ("127.0.0.2", "127.0.0.3"):
            through = cookieless_pages(proxy.port, "/glassbox/chat/", source, 20, forwarded=False)
            assert through == {200: 20}, (source, through)
        assert "X-Forwarded-For from 127.0.0.1 ignored" in app.log()
    finally:
        proxy.stop()
        app.stop()
