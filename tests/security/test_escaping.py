"""Hostile text - from the model or from a person - stays inside its fragment and its SSE frame:
`<script>`, quotes, `\\r`, blank lines, and lines that look like `data:` or `event:` fields."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markupsafe import escape

from tests.conftest import csrf_of, make_app, sse_events
from tests.support.chat_models import tiny_checkpoint
from webapp.web.sse import frame
from webapp.web.state import glassbox

HOSTILE = '<script>alert("x")</script>\'" onmouseover=alert(1) \r\nevent: done\ndata: <img src=x>\n\n: c\r\rid: 9'
HX = {"HX-Request": "true"}


def normalised(text: str) -> str:
    """What EventSource hands the page: every line break becomes \\n."""
    return re.sub(r"\r\n|\r", "\n", text)


@pytest.fixture
def parrot_app(tmp_path):
    """A chat model that says HOSTILE, whatever it is asked."""
    from webapp.chat.model.loading import load_chat_model
    model = load_chat_model(str(tiny_checkpoint(tmp_path / "chat")), arch="script:" + HOSTILE.encode().hex(),
                            factory="tests.support.served_models:build_chat_model")
    app = make_app(tmp_path, {"chat": model})
    yield app
    glassbox(app).core.shutdown()


def assert_frames_only(body: str) -> None:
    """Every line of the stream is a field we wrote: nothing a token says starts a line of its own."""
    for line in body.split("\n"):
        assert line == "" or line.startswith(("event: ", "data: ", ": ")), repr(line)
    assert re.findall(r"^event: (.*)$", body, re.M) == [n for n, _ in sse_events(body)]


def test_hostile_model_output_cannot_leave_its_token_fragment_or_its_frame(parrot_app):
    client = parrot_app.test_client()
    csrf = csrf_of(client, "/chat/")
    sent = client.post("/chat/send", data={"content": "say it", "csrf_token": csrf}, headers=HX)
    body = client.get(re.search(r'sse-connect="([^"]+)"', sent.get_data(as_text=True)).group(1)).get_data(as_text=True)
    assert_frames_only(body)
    events = sse_events(body)
    assert {n for n, _ in events} <= {"position", "running", "token", "done"}
    assert [n for n, _ in events].count("done") == 1 and events[-1][0] == "done"
    streamed = "".join(d for n, d in events if n == "token")
    # each token's text sits in the one span the server wraps it in (shaded by its odds); nothing else
    tokens = re.sub(r'<span class="tok s\d" title="[\d.]+%">|</span>', "", streamed)
    assert streamed.count("<span") == streamed.count("</span>") == len(HOSTILE.encode())
    # Each token (one byte here) is escaped and framed alone; SSE reads \r\n and a lone \r as one line
    # break each, and a \r\n split across two tokens still streams as one: nothing lost, nothing added.
    assert tokens == re.sub(r"\r\n|\r", "\n", str(escape(HOSTILE)))
    for _, data in events:
        assert "<script" not in data and "<img" not in data
    final = events[-1][1]
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&#39;&#34; onmouseover=alert(1)" in final
    page = client.get(sent.headers["HX-Push-Url"]).get_data(as_text=True)
    assert "<script>alert" not in page and "&lt;script&gt;alert" in page


def test_hostile_user_text_is_escaped_in_the_page_the_sidebar_and_the_error_path(parrot_app):
    client = parrot_app.test_client()
    csrf = csrf_of(client, "/chat/")
    text = '</textarea><script>alert(1)</script>"\'><b>'
    sent = client.post("/chat/send", data={"content": text, "csrf_token": csrf}, headers=HX)
    html = sent.get_data(as_text=True)
    assert "<script>alert(1)" not in html and "</textarea><script>" not in html
    assert html.count("&lt;/textarea&gt;&lt;script&gt;alert(1)&lt;/script&gt;") >= 2  # bubble and sidebar title
    # Refused input comes back in the textarea, still escaped.
    refused = client.post("/chat/send", data={"content": text + "x" * 9000, "csrf_token": csrf}, headers=HX)
    assert refused.status_code == 400
    assert "</textarea><script>" not in refused.get_data(as_text=True)


def test_hostile_loop_lab_fields_come_back_escaped(chat_app):
    client = chat_app.test_client()
    csrf = csrf_of(client, "/loops/")
    sources = list("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    evil = '"><script>alert(1)</script>'
    for path in ("/loops/run", "/loops/editor"):
        response = client.post(path, data={"csrf_token": csrf, "src": sources[:-1] + [evil], "dst": sources,
                                           "start": evil, "steps": evil}, headers=HX)
        html = response.get_data(as_text=True)
        assert "<script>alert(1)" not in html and "&#34;&gt;&lt;script&gt;" in html


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("ab <>&\"'\r\n:") + ["data:", "event:", "id:", "retry:", "\r\n"])).map("".join))
def test_any_text_survives_framing_exactly_and_only_as_data(text):
    body = frame("token", text)
    assert sse_events(body) == [("token", normalised(text))]
    assert_frames_only(body)
