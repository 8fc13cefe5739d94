"""X-Forwarded-* headers move the app's URLs (and its idea of the client) only when a configured
proxy sends them; from anyone else they are dropped."""

from __future__ import annotations

import pytest

from webapp.config import ConfigError
from webapp.web.security import TrustedProxies

FORWARDED = {"HTTP_X_FORWARDED_PREFIX": "/glassbox", "HTTP_X_FORWARDED_PROTO": "https",
             "HTTP_X_FORWARDED_FOR": "10.1.2.3"}


def test_a_trusted_proxy_puts_the_app_under_its_prefix(chat_app):
    # nginx on gunicorn's Unix socket (deploy/nginx.conf): a peer without an address
    page = chat_app.test_client().get("/chat/", headers={"X-Forwarded-Prefix": "/glassbox"},
                                      environ_base={"REMOTE_ADDR": ""})
    html = page.get_data(as_text=True)
    assert 'href="/glassbox/loops/"' in html and 'action="/glassbox/chat/send"' in html
    assert 'src="/glassbox/static/app.js"' in html


def test_anyone_else_cannot_move_the_apps_urls(chat_app):
    page = chat_app.test_client().get("/chat/", headers={"X-Forwarded-Prefix": "/evil"},
                                      environ_base={"REMOTE_ADDR": "192.0.2.7"})
    html = page.get_data(as_text=True)
    assert "/evil" not in html and 'href="/loops/"' in html


def seen_environ(allow: str, remote: str) -> dict:
    seen = {}

    def app(environ, start_response):
        seen.update(environ)
        return []

    TrustedProxies(app, allow)({"REMOTE_ADDR": remote, "SCRIPT_NAME": "", "PATH_INFO": "/", "wsgi.url_scheme": "http",
                                "HTTP_HOST": "h", **FORWARDED}, lambda *a: None)
    return seen


@pytest.mark.parametrize("allow, remote, trusted", [
    ("127.0.0.1", "127.0.0.1", True), ("127.0.0.1", "10.0.0.9", False), ("10.0.0.0/8, 127.0.0.1", "10.0.0.9", True),
    ("*", "203.0.113.5", True), ("", "127.0.0.1", False), ("127.0.0.1", "not-an-ip", False),
    ("", "", True)])  # a Unix socket's peer: only who may open the socket can be there
def test_only_configured_addresses_and_networks_are_believed(allow, remote, trusted):
    environ = seen_environ(allow, remote)
    if trusted:
        assert environ["SCRIPT_NAME"] == "/glassbox" and environ["wsgi.url_scheme"] == "https"
        assert environ["REMOTE_ADDR"] == "10.1.2.3"
    else:
        assert environ["SCRIPT_NAME"] == "" and environ["wsgi.url_scheme"] == "http"
        assert environ["REMOTE_ADDR"] == remote and "HTTP_X_FORWARDED_PREFIX" not in environ


def test_by_default_no_tcp_peer_is_a_proxy_not_even_a_local_one(chat_app):
    page = chat_app.test_client().get("/chat/", headers={"X-Forwarded-Prefix": "/glassbox"},
                                      environ_base={"REMOTE_ADDR": "127.0.0.1"})
    assert 'href="/loops/"' in page.get_data(as_text=True)  # any local process connects from 127.0.0.1


def test_a_bad_setting_stops_start_up_naming_the_variable():
    with pytest.raises(ConfigError, match="GLASSBOX_FORWARDED_ALLOW_IPS"):
        TrustedProxies(lambda e, s: [], "127.0.0.1, not-a-network")
