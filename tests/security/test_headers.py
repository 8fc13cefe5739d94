"""Security headers on every kind of response, and templates that need nothing the CSP forbids."""

from __future__ import annotations

import re

import pytest

from tests.conftest import csrf_of
from webapp.config import ROOT


def csp_directives(header: str) -> dict[str, str]:
    return {d.strip().split(" ", 1)[0]: d.strip().partition(" ")[2] for d in header.split(";") if d.strip()}


@pytest.mark.parametrize("path", ["/", "/chat/", "/loops/", "/static/app.js", "/static/app.css", "/healthz",
                                  "/metrics", "/no/such/page", "/chat/c/nope", "/api/loops/nope"])
def test_every_response_carries_the_security_headers(chat_app, path):
    response = chat_app.test_client().get(path)
    csp = csp_directives(response.headers["Content-Security-Policy"])
    assert csp["script-src"] == "'self'"  # no inline script, no eval
    assert "unsafe" not in response.headers["Content-Security-Policy"]
    assert csp["frame-ancestors"] == "'none'" and csp["object-src"] == "'none'" and csp["base-uri"] == "'none'"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Referrer-Policy"] == "same-origin"
    assert response.headers["X-Frame-Options"] == "DENY"


def test_streams_and_htmx_fragments_carry_them_too(chat_app):
    client = chat_app.test_client()
    csrf = csrf_of(client, "/chat/")
    fragment = client.post("/chat/send", data={"content": "hi", "max_new_tokens": "2", "csrf_token": csrf},
                           headers={"HX-Request": "true"})
    stream = client.get(re.search(r'sse-connect="([^"]+)"', fragment.get_data(as_text=True)).group(1))
    for response in (fragment, stream):
        assert "Content-Security-Policy" in response.headers
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert stream.headers["X-Accel-Buffering"] == "no" and stream.headers["Cache-Control"] == "no-cache"


def test_the_session_cookie_is_http_only_and_same_site(chat_app):
    cookie = chat_app.test_client().get("/chat/").headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie


TEMPLATES = sorted((ROOT / "templates").rglob("*.html"))


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: str(p.relative_to(ROOT / "templates")))
def test_templates_use_nothing_the_csp_forbids(template):
    text = template.read_text()
    for tag in re.findall(r"<script\b[^>]*>", text):
        assert "src=" in tag, f"inline script: {tag}"
    assert not re.search(r"\son[a-z]+\s*=", text), "inline event handler"
    assert "hx-on" not in text and "javascript:" not in text
    assert not re.search(r"\sstyle\s*=", text), "inline style attribute (style-src 'self')"
    assert "<style" not in text
