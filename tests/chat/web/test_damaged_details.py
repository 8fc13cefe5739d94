"""A reply whose saved details (reply_details) are damaged — not JSON, or JSON of another shape — is
shown without them, saying why: the tokens page, the conversation read as tokens, a token's panel,
Compare and Prompt answer with a message, never a 500."""

from __future__ import annotations

import pytest
from markupsafe import escape

from tests.conftest import csrf_of, make_app, wait_for
from tests.support.chat_models import tiny_chat_model
from tests.support.databases import app_rows
from webapp.chat.service import ChatService
from webapp.web.state import glassbox

DAMAGED = "The token odds saved with this reply are damaged and cannot be read, so it is shown without them."


@pytest.fixture
def app(tmp_path):
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat")}, torch_threads=1)
    yield app
    glassbox(app).core.shutdown()


def a_reply(app):
    client = app.test_client()
    csrf = csrf_of(client, "/chat/")
    sent = client.post("/chat/send", data={"csrf_token": csrf, "content": "hello", "max_new_tokens": "3"})
    conversation = sent.headers["Location"].rsplit("/", 1)[-1]
    assert wait_for(lambda: glassbox(app).core.counters["done"] == 1)
    reply = glassbox(app).service(ChatService).store.messages(conversation)[-1]
    return client, csrf, conversation, reply


def damage(app, field: str, value: str) -> None:
    app_rows(app, f"UPDATE reply_details SET {field} = ?", value)


@pytest.mark.parametrize("odds", ['[[1, 0.5', '{"a": 1}', '[["x"]]', '"text"'])
def test_damaged_odds_show_the_reply_without_them(app, odds):
    client, csrf, conversation, reply = a_reply(app)
    base = f"/chat/c/{conversation}/m/{reply.id}"
    assert client.post(f"{base}/view", data={"csrf_token": csrf, "view": "tokens"}).status_code == 303
    damage(app, "odds", odds)
    tokens = client.get(f"{base}/tokens")
    page = tokens.get_data(as_text=True)
    assert tokens.status_code == 200 and DAMAGED in page.replace("&#39;", "'")
    assert str(escape(reply.content)) in page or not reply.content.strip()  # the page escapes it
    assert client.get(f"/chat/c/{conversation}").status_code == 200  # read as tokens: shown as text
    panel = client.get(f"{base}/tokens/0")
    assert panel.status_code == 404 and "damaged" in panel.get_data(as_text=True)
    assert client.get(f"{base}/compare/{reply.id}").status_code == 200
    branch = client.post(f"{base}/branch", data={"csrf_token": csrf, "index": "0", "text": "x"})
    assert branch.status_code == 409 and "damaged" in branch.get_data(as_text=True)


@pytest.mark.parametrize("prompt", ["{not json", "[1, 2]", '{"ids": 5}'])
def test_a_damaged_prompt_says_so(app, prompt):
    client, _, conversation, reply = a_reply(app)
    damage(app, "prompt", prompt)
    answer = client.get(f"/chat/c/{conversation}/m/{reply.id}/prompt")
    assert answer.status_code == 404
    assert "The prompt saved with this reply is damaged and cannot be read." in answer.get_data(as_text=True)
