"""Every limit answers with a clear message: message length, conversation length, request body,
open streams, jobs per browser (chat and Loop lab together) and the shared queue."""

from __future__ import annotations

import io
import re
import string

import pytest

from tests.conftest import csrf_of, make_app, wait_for
from tests.support.chat_models import tiny_chat_model
from tests.support.loop_models import bundle
from webapp.chat.service import ChatService
from webapp.web.state import glassbox

HX = {"HX-Request": "true"}
LETTERS = list(string.ascii_uppercase)


@pytest.fixture
def limited(tmp_path, request):
    """An app with the test's own limits; replies take 20 ms a token and never end early."""
    models = {"chat": tiny_chat_model(tmp_path / "chat", seconds_per_step=0.02), "loops": bundle(delay=0.02)}
    app = make_app(tmp_path, models, **getattr(request, "param", {}))
    yield app
    glassbox(app).core.shutdown()


def send(client, content="hi", **fields):
    csrf = csrf_of(client, "/chat/")
    return client.post("/chat/send", data={"content": content, "csrf_token": csrf, **fields}, headers=HX)


def run(client, path="/loops/run"):
    csrf = csrf_of(client, "/loops/")
    return client.post(path, data={"csrf_token": csrf, "src": LETTERS, "dst": LETTERS[1:] + LETTERS[:1],
                                   "start": "A", "steps": "30"}, headers=HX)


def text(response) -> str:
    return response.get_data(as_text=True)


def test_messages_are_limited_to_8000_characters(limited):
    client = limited.test_client()
    over = send(client, "x" * 8001)
    assert over.status_code == 400
    assert "Messages are limited to 8,000 characters; this one has 8,001." in text(over)
    at_limit = send(client, "x" * 8000)  # allowed by this limit (the tiny model's window refuses it)
    assert "Messages are limited" not in text(at_limit) and "too long for this model" in text(at_limit)


@pytest.mark.parametrize("limited", [{"max_messages": 4}], indirect=True)
def test_a_conversation_is_limited_in_messages(limited):
    client = limited.test_client()
    first = send(client, "one", max_new_tokens="2")
    cid = re.search(r'name="conversation_id" value="(\w+)"', text(first)).group(1)
    core = glassbox(limited).core
    assert wait_for(lambda: core.counters["done"] == 1)
    assert send(client, "two", conversation_id=cid, max_new_tokens="2").status_code == 200
    assert wait_for(lambda: core.counters["done"] == 2)
    third = send(client, "three", conversation_id=cid)
    assert third.status_code == 400 and "reached its limit of 4 messages. Start a new chat." in text(third)
    assert third.headers["HX-Retarget"] == "#composer"


@pytest.mark.parametrize("limited", [{"max_messages": 4}], indirect=True)
def test_every_version_counts_toward_the_limit_of_messages(limited):
    """Regenerate and Branch add versions, not turns: they are bounded by the same limit."""
    client = limited.test_client()
    first = send(client, "one", max_new_tokens="2")
    cid = re.search(r'name="conversation_id" value="(\w+)"', text(first)).group(1)
    core = glassbox(limited).core
    for done in (1, 2, 3):
        assert wait_for(lambda done=done: core.counters["done"] == done)
        if done < 3:
            regenerated = client.post(f"/chat/c/{cid}/regenerate", data={"csrf_token": csrf_of(client, "/chat/"),
                                                                         "max_new_tokens": "2"}, headers=HX)
            assert regenerated.status_code == 200
    refused = client.post(f"/chat/c/{cid}/regenerate", data={"csrf_token": csrf_of(client, "/chat/")}, headers=HX)
    assert refused.status_code == 400 and "reached its limit of 4 messages. Start a new chat." in text(refused)
    assert "Every version counts" in text(refused)
    store = glassbox(limited).service(ChatService).store
    assert len(store.all_messages(cid)) == 4 and core.counters["done"] == 3


@pytest.mark.parametrize("limited", [{"max_body_bytes": 4096}], indirect=True)
def test_request_bodies_are_limited(limited):
    client = limited.test_client()
    big = send(client, "x" * 5000)
    assert big.status_code == 413 and "This request is too large: the limit is 4 KiB." in text(big)
    assert big.headers["HX-Retarget"] == "#flash"
    upload = client.post("/loops/traces/upload", data={"csrf_token": csrf_of(client, "/loops/"),
                                                       "trace": (io.BytesIO(b"{" * 5000), "t.json")})
    assert upload.status_code == 413
    # said beside the upload field like any other bad file, not on an error page that loses the form
    page = text(upload)
    assert 'id="trace-file-error" role="alert" tabindex="-1" autofocus>That file is too large: the limit is 4 KiB.' \
        in page and 'id="editor"' in page and '<details class="saved" open' in page
    assert glassbox(limited).core.counters["submitted"] == 0


@pytest.mark.parametrize("limited", [{"max_streams": 1}], indirect=True)
def test_open_streams_are_limited(limited):
    client = limited.test_client()
    first = send(client, max_new_tokens="200")
    second = send(client, max_new_tokens="200")
    urls = [re.findall(r'sse-connect="([^"]+)"', text(r))[-1] for r in (first, second)]
    streaming = client.get(urls[0], buffered=False)
    body = iter(streaming.response)
    next(body)  # the stream is open and holds its thread
    refused = client.get(urls[1])
    assert refused.status_code == 503 and "Too many open streams" in text(refused)
    streaming.close()


@pytest.mark.parametrize("limited", [{"max_jobs_per_owner": 2}], indirect=True)
def test_jobs_per_browser_are_limited_across_chat_and_loop_lab(limited):
    client = limited.test_client()
    assert send(client, max_new_tokens="200").status_code == 200
    assert run(client).status_code == 200
    chat = send(client)
    assert chat.status_code == 429 and "You already have runs or replies waiting or running." in text(chat)
    loops = run(client)
    assert loops.status_code == 429 and "You already have runs or replies waiting or running." in text(loops)
    assert loops.headers["HX-Retarget"] == "#flash"
    api = client.post("/api/loops/trace", json={"mapping": [[a, a] for a in LETTERS], "start": "A", "steps": 2})
    assert api.status_code == 429 and "waiting or running" in api.get_json()["error"]
    other = limited.test_client()  # another browser is not held up by the first one's limit
    assert send(other, max_new_tokens="2").status_code == 200


@pytest.mark.parametrize("limited", [{"max_jobs_per_owner": 1}], indirect=True)
def test_a_refused_regenerate_or_edit_loses_nothing(limited):
    client = limited.test_client()
    first = send(client, "first question", max_new_tokens="3")
    cid = re.search(r'name="conversation_id" value="(\w+)"', text(first)).group(1)
    core = glassbox(limited).core
    assert wait_for(lambda: core.counters["done"] == 1)
    before = text(client.get(f"/chat/c/{cid}"))
    user_id, reply_id = re.findall(r'id="message-(\d+)"', before)
    assert run(client).status_code == 200  # the browser's one job slot is now taken
    csrf = csrf_of(client, f"/chat/c/{cid}")
    regenerate = client.post(f"/chat/c/{cid}/regenerate", data={"csrf_token": csrf}, headers=HX)
    edit = client.post(f"/chat/c/{cid}/m/{user_id}/edit", data={"csrf_token": csrf, "content": "second thought"},
                       headers=HX)
    for refused in (regenerate, edit):
        assert refused.status_code == 429 and "waiting or running" in text(refused)
    assert "second thought" in text(edit)  # the edited text is given back
    after = text(client.get(f"/chat/c/{cid}"))
    assert re.findall(r'id="message-(\d+)"', after) == [user_id, reply_id]
    assert "first question" in after and "second thought" not in after


@pytest.mark.parametrize("limited", [{"max_queue": 1, "max_batch": 1}], indirect=True)
def test_the_shared_queue_is_limited(limited):
    clients = [limited.test_client() for _ in range(3)]
    assert send(clients[0], max_new_tokens="200").status_code == 200  # runs
    core = glassbox(limited).core
    assert wait_for(lambda: core.running_jobs())
    assert send(clients[1], max_new_tokens="200").status_code == 200  # waits
    busy = send(clients[2])
    assert busy.status_code == 503 and "The server is busy; try again in a moment" in text(busy)
    assert busy.headers["HX-Retarget"] == "#composer"
    assert run(clients[2]).status_code == 503
    # nothing was saved for the refused send: no conversation in that browser's sidebar
    assert "/chat/c/" not in text(clients[2].get("/chat/")).split('id="conversations"')[1].split("</nav>")[0]
