"""Two front ends (two apps, each its own instance folder, one secret key) on one PostgreSQL database:
a browser's conversation made through one is listed and read through the other, and its running reply
read there as it grows; its per-browser quota and its address's quota count what it keeps through both;
another browser sees none of it; the instance lock is SQLite's only, and a front end without the shared
secret key says so."""

from __future__ import annotations

import re

import pytest

from tests.conftest import csrf_of, make_app, wait_for
from tests.support.chat_models import tiny_chat_model
from tests.support.loop_models import bundle
from webapp import create_app
from webapp.chat.service import ChatService
from webapp.config import Settings
from webapp.web.state import glassbox

SESSION = "glassbox_session"


@pytest.fixture
def front_ends(tmp_path, postgres_url, request):
    overrides = getattr(request, "param", {})
    model = tiny_chat_model(tmp_path / "chat")
    apps = [make_app(tmp_path / name, {"chat": model}, database_url=postgres_url, **overrides) for name in "ab"]
    yield apps
    for app in apps:
        glassbox(app).core.shutdown()


def send(client, content="hi"):
    return client.post("/chat/send", data={"csrf_token": csrf_of(client, "/chat/"), "content": content,
                                           "max_new_tokens": "2"})


def same_browser(client, other_app):
    """A client of `other_app` sending `client`'s cookie: the browser moved to the other front end."""
    moved = other_app.test_client()
    moved.set_cookie(SESSION, client.get_cookie(SESSION).value)
    return moved


def finished(app, location):
    store = glassbox(app).service(ChatService).store
    return wait_for(lambda: "pending" not in store.messages(location.rsplit("/", 1)[1])[-1].status, timeout=10)


def test_a_conversation_made_through_one_front_end_is_read_through_the_other(front_ends):
    a, b = front_ends
    on_a = a.test_client()
    made = send(on_a, "Hello from a")
    assert made.status_code == 303
    assert finished(a, made.headers["Location"])
    on_b = same_browser(on_a, b)
    assert "Hello from a" in on_b.get(made.headers["Location"]).get_data(as_text=True)
    assert made.headers["Location"].rsplit("/", 1)[1] in on_b.get("/chat/").get_data(as_text=True)
    stranger = b.test_client()
    assert stranger.get(made.headers["Location"]).status_code == 404  # isolation holds across front ends


def test_the_instance_lock_is_sqlites_only(front_ends, tmp_path):
    assert not (tmp_path / "a" / "instance" / "glassbox.lock").exists()
    a, b = front_ends
    assert glassbox(a).db.runner != glassbox(b).db.runner


@pytest.mark.parametrize("front_ends", [{"max_conversations": 1}], indirect=True)
def test_a_browsers_quota_counts_what_it_keeps_through_every_front_end(front_ends):
    a, b = front_ends
    on_a = a.test_client()
    assert send(on_a).status_code == 303
    refused = send(same_browser(on_a, b))
    assert refused.status_code == 403 and "You have 1 conversations" in refused.get_data(as_text=True)


@pytest.mark.parametrize("front_ends", [{"max_new_browser_bytes_per_address": 100,
                                         "max_stored_bytes": 0}], indirect=True)
def test_an_addresss_new_browsers_share_one_quota_across_front_ends(front_ends):
    a, b = front_ends
    assert send(a.test_client(), "x" * 90).status_code == 303
    refused = send(b.test_client(), "y" * 20)  # another new browser, same address, the other front end
    assert refused.status_code == 403 and "New browsers from your address" in refused.get_data(as_text=True)


def test_a_running_reply_is_saved_as_it_grows_and_read_so_through_the_other_front_end(tmp_path, postgres_url):
    model = tiny_chat_model(tmp_path / "chat", seconds_per_step=0.02)
    a, b = (make_app(tmp_path / name, {"chat": model}, database_url=postgres_url) for name in "ab")
    try:
        on_a = a.test_client()
        made = on_a.post("/chat/send", data={"csrf_token": csrf_of(on_a, "/chat/"), "content": "go",
                                              "max_new_tokens": "200"}, headers={"HX-Request": "true"})
        conversation = re.search(r'name="conversation_id" value="([0-9a-f]+)"', made.get_data(as_text=True))[1]
        through_b = glassbox(b).service(ChatService).store

        def growing():
            reply = through_b.messages(conversation)[-1]
            return reply.status == "pending" and reply.content != ""
        assert wait_for(growing, timeout=10)
        partial = through_b.messages(conversation)[-1]
        assert partial.runner == glassbox(a).db.runner
        assert wait_for(lambda: through_b.messages(conversation)[-1].status == "complete", timeout=20)
        assert through_b.messages(conversation)[-1].content.startswith(partial.content)
    finally:
        for app in (a, b):
            glassbox(app).core.shutdown()


def test_a_front_end_on_postgres_without_a_shared_key_says_so(tmp_path, postgres_url, caplog):
    settings = Settings(instance_path=str(tmp_path / "instance"), database_url=postgres_url)
    with caplog.at_level("WARNING", logger="glassbox"):
        app = create_app(settings, models={"loops": bundle()}, test_config={"TESTING": True})
    glassbox(app).core.shutdown()
    assert "Give every front end the same GLASSBOX_SECRET_KEY" in caplog.text
