"""Concurrent sends and regenerations through the app (the Flask test client, one browser a thread):
every one is answered with the page, none with a 500, and every message is kept."""

from __future__ import annotations

import re
import threading

import pytest

from tests.conftest import csrf_of, make_app
from tests.support.chat_models import tiny_chat_model
from webapp.chat.service import ChatService
from webapp.web.state import glassbox

SENDERS = 8
REGENERATORS = 4
TURNS = 5


@pytest.fixture
def app(tmp_path):
    # one address for every browser here: the per-address limits would refuse what a room of addresses may do
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat")}, max_jobs_per_client=0,
                   max_streams_per_client=0, torch_threads=1)
    yield app
    glassbox(app).core.shutdown()


def browser(app, name: str, regenerate: bool, answers: list) -> None:
    """Without JavaScript each form waits for its reply, as a person waits before the next message."""
    client = app.test_client()
    csrf = csrf_of(client, "/chat/")
    fields = {"csrf_token": csrf, "max_new_tokens": "4"}
    first = client.post("/chat/send", data={**fields, "content": f"{name} #0"})
    answers.append(first.status_code)
    conversation = first.headers["Location"].rsplit("/", 1)[-1]
    for turn in range(1, TURNS):
        if regenerate:
            answer = client.post(f"/chat/c/{conversation}/regenerate", data=fields)
        else:
            answer = client.post("/chat/send", data={**fields, "content": f"{name} #{turn}",
                                                     "conversation_id": conversation})
        answers.append(answer.status_code)


def test_concurrent_sends_and_regenerations_all_succeed_and_nothing_is_lost(app):
    answers: list[int] = []
    threads = [threading.Thread(target=browser, args=(app, f"send{i}", False, answers)) for i in range(SENDERS)]
    threads += [threading.Thread(target=browser, args=(app, f"regen{i}", True, answers)) for i in range(REGENERATORS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [303] * ((SENDERS + REGENERATORS) * TURNS)
    store = glassbox(app).service(ChatService).store
    with store.db.connect() as db:
        questions = [r[0] for r in db.execute("SELECT content FROM messages WHERE role = 'user'")]
        replies = db.execute("SELECT status, COUNT(*) FROM messages WHERE role = 'assistant' GROUP BY status")
        assert dict(replies.fetchall()) == {"complete": (SENDERS + REGENERATORS) * TURNS}
    assert sorted(questions) == sorted([f"send{i} #{t}" for i in range(SENDERS) for t in range(TURNS)]
                                       + [f"regen{i} #0" for i in range(REGENERATORS)])
    assert all(re.fullmatch(r"\w+ #\d", q) for q in questions)
