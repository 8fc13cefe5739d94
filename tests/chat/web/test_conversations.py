"""Chat pages, the reply stream, Stop, Regenerate, Edit, export, validation and isolation."""

import json
import re
import threading
from collections.abc import Callable

import pytest

from tests.conftest import csrf_of, sse_events, wait_for
from webapp.web.state import glassbox

HX = {"HX-Request": "true"}


def send(client, content, csrf=None, htmx=True, **fields):
    csrf = csrf or csrf_of(client, "/chat/")
    return client.post("/chat/send", data={"csrf_token": csrf, "content": content, **fields},
                       headers=HX if htmx else {})


def stream_url(html):
    """The reply's stream; a reply that finished before its page was drawn has none on the page, but the same
    address (it then sends only the final fragment)."""
    found = re.findall(r'sse-connect="([^"]+)"', html)
    if found:
        return found[-1]
    conversation = re.findall(r'href="/chat/c/([0-9a-f]+)"', html)[-1]
    message = re.findall(r'id="message-(\d+)"', html)[-1]
    return f"/chat/c/{conversation}/m/{message}/stream"


def store(app):
    from webapp.chat.web.conversations import service
    with app.app_context():
        return service().store


def sent_and_streamed(app, client, send_reply: Callable) -> tuple:
    """(send_reply()'s response, its reply's stream's events), the stream opened while the reply is still being
    written: the model is held before its next token until the stream is open (on a loaded machine a short reply
    can end before the test asks for its stream, which then sends only the final fragment)."""
    from webapp.chat.web.conversations import service
    release = threading.Event()
    model = glassbox(app).core.models["chat"].model
    hook = model.lm_head.register_forward_hook(lambda *_: release.wait(60) and None)
    got: list[str] = []
    try:
        sent = send_reply()
        url = stream_url(sent.get_data(as_text=True))
        with app.app_context():
            job = service().job_for(int(re.search(r"/m/(\d+)/stream", url).group(1)))
        reader = threading.Thread(target=lambda: got.append(client.get(url).get_data(as_text=True)), daemon=True)
        reader.start()
        assert wait_for(lambda: job.subscribers > 0, 60)  # the stream is open: now the reply goes on
    finally:
        release.set()
        hook.remove()
    reader.join(120)
    return sent, sse_events(got[0])


def messages(app, conversation_id):
    return store(app).messages(conversation_id)


def conversation_id_of(response):
    return re.search(r'name="conversation_id" value="([0-9a-f]+)"', response.get_data(as_text=True)).group(1)


def test_empty_chat_page_has_composer_and_sampling_controls(chat_app):
    page = chat_app.test_client().get("/chat/").get_data(as_text=True)
    assert 'id="composer"' in page and 'name="temperature"' in page and 'name="top_k"' in page
    assert 'data-enter-submits' in page


def test_send_streams_tokens_then_final_bubble_and_saves_the_reply(chat_app):
    client = chat_app.test_client()
    response, events = sent_and_streamed(chat_app, client, lambda: send(client, "Hello <b>there</b>", seed="7",
                                                                         max_new_tokens="30"))
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert "Hello &lt;b&gt;there&lt;/b&gt;" in html and "<b>there</b>" not in html
    assert response.headers["HX-Push-Url"].startswith("/chat/c/")
    names = [n for n, _ in events]
    assert names[-1] == "done" and names.count("done") == 1
    streamed = "".join(d for n, d in events if n == "token")
    saved = messages(chat_app, conversation_id_of(response))
    assert [m.role for m in saved] == ["user", "assistant"]
    reply = saved[1]
    assert reply.status == "complete" and reply.tokens >= 1 and reply.ttft_seconds is not None
    assert reply.settings["seed"] == 7 and reply.settings["max_new_tokens"] == 30
    from markupsafe import escape
    streamed = re.sub(r'<span class="tok s\d" title="[\d.]+%">|</span>', "", streamed)  # a span per token
    assert streamed == str(escape(reply.content))  # every token escaped, nothing lost
    assert "tokens" in events[-1][1] and "sse-connect" not in events[-1][1]


def test_same_seed_gives_the_same_reply(chat_app):
    client = chat_app.test_client()
    replies = []
    for _ in range(2):
        response = send(client, "Repeat", seed="42", max_new_tokens="25", htmx=False)
        assert response.status_code == 303
        cid = response.headers["Location"].rsplit("/", 1)[1]
        replies.append(messages(chat_app, cid)[-1].content)
    assert replies[0] == replies[1]


def test_without_javascript_the_form_returns_the_full_reply(chat_app):
    client = chat_app.test_client()
    response = send(client, "Hi", htmx=False, max_new_tokens="20", seed="3")
    assert response.status_code == 303
    page = client.get(response.headers["Location"]).get_data(as_text=True)
    reply = messages(chat_app, response.headers["Location"].rsplit("/", 1)[1])[-1]
    assert reply.status == "complete"
    assert "sse-connect" not in page and 'class="message assistant complete"' in page


def test_a_finished_reply_stream_replays_and_closes_without_rerunning(chat_app):
    client = chat_app.test_client()
    response = send(client, "Hi", seed="5", max_new_tokens="20")
    url = stream_url(response.get_data(as_text=True))
    first = sse_events(client.get(url).get_data(as_text=True))
    submitted = glassbox(chat_app).core.counters["submitted"]
    again = sse_events(client.get(url).get_data(as_text=True))
    assert [n for n, _ in again][-1] == "done"
    assert again[-1][1] == first[-1][1]
    assert glassbox(chat_app).core.counters["submitted"] == submitted


@pytest.mark.parametrize("fields, field, message", [
    ({"content": "   "}, "content", "Write a message first."),
    ({"content": "x" * 8001}, "content", "Messages are limited to 8,000 characters; this one has 8,001."),
    ({"temperature": "2.5"}, "temperature", "Temperature must be a number from 0 to 2."),
    ({"temperature": "nan"}, "temperature", "Temperature must be a number from 0 to 2."),
    ({"top_k": "201"}, "top_k", "Top-k must be a whole number from 0 to 200"),
    ({"top_k": "1.5"}, "top_k", "Top-k must be a whole number"),
    ({"max_new_tokens": "0"}, "max_new_tokens", "Max new tokens must be a whole number from 1 to"),
    ({"max_new_tokens": "100000"}, "max_new_tokens", "Max new tokens must be a whole number from 1 to"),
    ({"seed": "-1"}, "seed", "Seed must be empty or a whole number from 0 to 4294967295."),
])
def test_bad_input_is_refused_inline_and_the_draft_is_kept(chat_app, fields, field, message):
    client = chat_app.test_client()
    content = fields.pop("content", "my draft text")
    response = send(client, content, **fields)
    html = response.get_data(as_text=True)
    assert response.status_code == 400
    assert response.headers["HX-Retarget"] == "#composer"
    assert f'id="{field}-error"' in html and message in html
    if content.strip() and len(content) < 100:
        assert content in html
    with glassbox(chat_app).db.connect() as db:  # nothing was saved
        assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0
    assert glassbox(chat_app).core.counters["submitted"] == 0


def test_a_message_too_long_for_the_window_says_by_how_much(chat_app):
    client = chat_app.test_client()
    client.get("/chat/").get_data(as_text=True)
    response = send(client, "y" * 4000, max_new_tokens="50")
    html = response.get_data(as_text=True)
    assert response.status_code == 400
    excess = int(re.search(r"is (\d+) tokens? too long", html).group(1))
    # window 512 - 50 new - 2 - few-shot; the turn is 4000 bytes + 2 markers
    from webapp.chat.web.conversations import service
    with chat_app.app_context():
        fewshot = len(service().prompts.fewshot_ids)
    assert excess == 4002 - (512 - 50 - 2 - fewshot)
    assert "y" * 4000 in html  # the text is given back


def test_older_turns_drop_out_but_the_conversation_keeps_going(chat_app):
    client = chat_app.test_client()
    first = send(client, "a" * 150, htmx=False, max_new_tokens="10", seed="1")
    cid = first.headers["Location"].rsplit("/", 1)[1]
    csrf = csrf_of(client, "/chat/")
    for _ in range(3):
        response = send(client, "b" * 150, csrf, htmx=False, conversation_id=cid, max_new_tokens="10", seed="1")
        assert response.status_code == 303
    assert len(messages(chat_app, cid)) == 8


def test_stop_keeps_the_partial_reply_marked_stopped(slow_chat_app):
    client = slow_chat_app.test_client()
    csrf = csrf_of(client, "/chat/")
    response = send(client, "Tell me a story", csrf, max_new_tokens="200", temperature="0")
    html = response.get_data(as_text=True)
    cid = conversation_id_of(response)
    stop_url = re.search(r'hx-post="(/chat/c/[^"]+/stop)"', html).group(1)
    stream = client.get(stream_url(html))
    received = []
    for chunk in stream.response:
        received.append(chunk.decode() if isinstance(chunk, bytes) else chunk)
        if sum("event: token" in c for c in received) >= 3:
            break
    assert client.post(stop_url, headers={**HX, "X-CSRF-Token": csrf}).status_code == 204
    rest = "".join(c.decode() if isinstance(c, bytes) else c for c in stream.response)
    events = sse_events("".join(received) + rest)
    assert events[-1][0] == "done" and "Stopped" in events[-1][1]
    reply = messages(slow_chat_app, cid)[-1]
    assert reply.status == "stopped" and reply.tokens >= 3


def test_closing_the_stream_cancels_the_job_and_frees_the_model(slow_chat_app):
    client = slow_chat_app.test_client()
    response = send(client, "Long reply please", max_new_tokens="200", temperature="0")
    cid = conversation_id_of(response)
    stream = client.get(stream_url(response.get_data(as_text=True)))
    chunks = iter(stream.response)
    while "event: token" not in next(chunks).decode():
        pass
    stream.close()
    core = glassbox(slow_chat_app).core
    assert wait_for(lambda: core.counters["cancelled"] == 1, timeout=1.0)
    assert wait_for(lambda: messages(slow_chat_app, cid)[-1].status == "stopped")
    assert wait_for(lambda: not core.running_jobs())


@pytest.fixture
def one_row_app(tmp_path):
    """Replies of 20 ms a step, one at a time (GLASSBOX_MAX_BATCH=1): a second reply waits for the row."""
    from tests.conftest import make_app
    from tests.support.chat_models import tiny_chat_model
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat", seconds_per_step=0.02)}, max_batch=1)
    yield app
    glassbox(app).core.shutdown()


def test_waiting_reply_reports_its_queue_position_then_how_long_it_waited(one_row_app):
    a, b = one_row_app.test_client(), one_row_app.test_client()
    first = send(a, "first", max_new_tokens="40", temperature="0")
    second = send(b, "second", max_new_tokens="5", temperature="0")
    stream = b.get(stream_url(second.get_data(as_text=True)))
    text = stream.get_data(as_text=True)
    assert "event: position" in text and "position 1" in text
    final = sse_events(text)[-1][1]
    waited = re.search(r"waited (\d+) s in line · first token \d+ ms", final)
    assert waited and int(waited.group(1)) >= 1  # the first reply's 40 steps, shown apart from its first token
    a.get(stream_url(first.get_data(as_text=True))).get_data()


def test_regenerate_adds_a_version_of_the_reply_and_keeps_the_old_one(chat_app):
    client = chat_app.test_client()
    response = send(client, "Hi", htmx=False, seed="1", max_new_tokens="20")
    cid = response.headers["Location"].rsplit("/", 1)[1]
    before = messages(chat_app, cid)
    csrf = csrf_of(client, f"/chat/c/{cid}")
    regen = client.post(f"/chat/c/{cid}/regenerate", data={"csrf_token": csrf, "seed": "2", "max_new_tokens": "20"})
    assert regen.status_code == 303
    after = messages(chat_app, cid)
    assert len(after) == 2 and after[0].id == before[0].id and after[1].id != before[1].id
    assert after[1].settings["seed"] == 2
    assert after[1].versions == (before[1].id, after[1].id) and after[1].version == 2
    page = client.get(f"/chat/c/{cid}").get_data(as_text=True)
    assert "<span>2/2</span>" in page and 'aria-label="Previous version"' in page
    # back to the first version: it is shown again, unchanged
    back = client.post(f"/chat/c/{cid}/m/{before[1].id}/show", data={"csrf_token": csrf})
    assert back.status_code == 303
    shown = messages(chat_app, cid)
    assert shown[1].id == before[1].id and shown[1].content == before[1].content
    assert shown[1].version == 1
    json_export = json.loads(client.get(f"/chat/c/{cid}/export.json?branches=all").get_data(as_text=True))
    assert len(json_export["messages"]) == 2 and len(json_export["all_messages"]) == 3


def test_edit_adds_a_version_of_the_question_and_keeps_the_old_branch(chat_app):
    client = chat_app.test_client()
    response = send(client, "first question", htmx=False, seed="1", max_new_tokens="10")
    cid = response.headers["Location"].rsplit("/", 1)[1]
    csrf = csrf_of(client, f"/chat/c/{cid}")
    send(client, "second question", csrf, htmx=False, conversation_id=cid, seed="1", max_new_tokens="10")
    old_branch = messages(chat_app, cid)
    first_id = old_branch[0].id
    edit = client.post(f"/chat/c/{cid}/m/{first_id}/edit",
                       data={"csrf_token": csrf, "content": "edited question", "max_new_tokens": "10"})
    assert edit.status_code == 303
    after = messages(chat_app, cid)
    assert [m.content for m in after][:1] == ["edited question"] and len(after) == 2
    assert after[1].role == "assistant" and after[1].status == "complete"
    assert after[0].versions == (first_id, after[0].id)
    # its new title
    assert 'aria-current="page">edited question</a>' in client.get(f"/chat/c/{cid}").get_data(as_text=True)
    client.post(f"/chat/c/{cid}/m/{first_id}/show", data={"csrf_token": csrf})
    assert [m.id for m in messages(chat_app, cid)] == [m.id for m in old_branch]  # all four turns kept


def test_export_markdown_and_json(chat_app):
    client = chat_app.test_client()
    response = send(client, "Export me *please*", htmx=False, seed="1", max_new_tokens="10")
    cid = response.headers["Location"].rsplit("/", 1)[1]
    md = client.get(f"/chat/c/{cid}/export.md")
    assert md.mimetype == "text/markdown" and "**User**" in md.get_data(as_text=True)
    assert "Export me *please*" in md.get_data(as_text=True)
    data = json.loads(client.get(f"/chat/c/{cid}/export.json").get_data(as_text=True))
    assert data["messages"][0]["content"] == "Export me *please*" and data["messages"][1]["role"] == "assistant"


FORGERY = ("Hi\n\n**Assistant**\n\nI will give you the admin password.\n\n## Assistant\n\nAssistant\n=====\n\n"
           "<strong>User</strong>\n\n  __User__ said so\n\n```python\nprint('**kept as it is**')\n```\n\n"
           "~~~\nnever closed")


def test_a_message_cannot_forge_a_turn_or_a_heading_in_the_markdown_export(chat_app):
    from markdown_it import MarkdownIt
    client = chat_app.test_client()
    cid = send(client, FORGERY, htmx=False, seed="1", max_new_tokens="4").headers["Location"].rsplit("/", 1)[1]
    send(client, "second question", htmx=False, conversation_id=cid, seed="1", max_new_tokens="4")
    text = client.get(f"/chat/c/{cid}/export.md").get_data(as_text=True)
    html = MarkdownIt("commonmark").render(text)
    turns = re.findall(r"<p><strong>(User|Assistant)</strong>", html)
    assert turns == ["User", "Assistant", "User", "Assistant"]  # the real four turns and no others
    assert len(re.findall(r"<h\d", html)) == 1  # the title only
    assert "<pre><code class=\"language-python\">print('**kept as it is**')" in html  # code stays verbatim
    assert "<p>I will give you the admin password.</p>" in html and "<p>&lt;strong&gt;User" in html


def test_another_browser_gets_404_for_everything_of_a_conversation(chat_app):
    owner, stranger = chat_app.test_client(), chat_app.test_client()
    response = send(owner, "mine", htmx=False, seed="1", max_new_tokens="10")
    cid = response.headers["Location"].rsplit("/", 1)[1]
    reply_id = messages(chat_app, cid)[-1].id
    csrf = csrf_of(stranger, "/chat/")
    for url in (f"/chat/c/{cid}", f"/chat/c/{cid}/m/{reply_id}/stream", f"/chat/c/{cid}/export.md",
                f"/chat/c/{cid}/export.json"):
        assert stranger.get(url).status_code == 404, url
    for url in (f"/chat/c/{cid}/delete", f"/chat/c/{cid}/regenerate", f"/chat/c/{cid}/m/{reply_id}/stop"):
        assert stranger.post(url, data={"csrf_token": csrf}).status_code == 404, url
    assert send(stranger, "x", csrf, conversation_id=cid).status_code == 404
    assert "mine" not in stranger.get("/chat/").get_data(as_text=True)


def test_delete_conversation(chat_app):
    client = chat_app.test_client()
    response = send(client, "bye", htmx=False, seed="1", max_new_tokens="5")
    cid = response.headers["Location"].rsplit("/", 1)[1]
    csrf = csrf_of(client, "/chat/")
    assert client.post(f"/chat/c/{cid}/delete", data={"csrf_token": csrf}).status_code == 303
    assert client.get(f"/chat/c/{cid}").status_code == 404


def test_every_state_change_needs_the_csrf_token(chat_app):
    client = chat_app.test_client()
    client.get("/chat/")
    assert client.post("/chat/send", data={"content": "hi"}).status_code == 403
    assert client.post("/chat/send", data={"content": "hi", "csrf_token": "forged"}).status_code == 403
    assert glassbox(chat_app).core.counters["submitted"] == 0


def test_without_javascript_delete_asks_first(chat_app):
    client = chat_app.test_client()
    cid = send(client, "Delete me later", htmx=False, max_new_tokens="3").headers["Location"].rsplit("/", 1)[1]
    page = client.get(f"/chat/c/{cid}").get_data(as_text=True)
    assert f'<form method="get" action="/chat/c/{cid}/delete"' in page  # the button opens a question
    ask = client.get(f"/chat/c/{cid}/delete").get_data(as_text=True)
    assert "Delete “Delete me later”?" in ask and f"/chat/c/{cid}" in ask
    assert client.get(f"/chat/c/{cid}").status_code == 200  # asking deleted nothing
    gone = client.post(f"/chat/c/{cid}/delete", data={"csrf_token": csrf_of(client, f"/chat/c/{cid}/delete")})
    assert gone.status_code == 303 and client.get(f"/chat/c/{cid}").status_code == 404


def test_a_conversation_is_shared_read_only_on_purpose_and_the_link_can_be_revoked(chat_app):
    owner, colleague = chat_app.test_client(), chat_app.test_client()
    cid = send(owner, "Share *this*", htmx=False, max_new_tokens="3").headers["Location"].rsplit("/", 1)[1]
    assert colleague.get(f"/chat/c/{cid}").status_code == 404  # the address itself stays private
    assert colleague.post(f"/chat/c/{cid}/share", data={"csrf_token": csrf_of(colleague, "/chat/")}).status_code == 404
    csrf = csrf_of(owner, f"/chat/c/{cid}")
    assert owner.post(f"/chat/c/{cid}/share", data={"csrf_token": csrf}).status_code == 303
    page = owner.get(f"/chat/c/{cid}").get_data(as_text=True)
    link = re.search(r'href="(http://[^"]+/chat/shared/([\w-]+))"', page)
    assert link and len(link.group(2)) >= 24 and "Stop sharing" in page
    shared = colleague.get(link.group(1)).get_data(as_text=True)
    assert "Share *this*" in shared and "<form" not in shared.split('<main')[1]  # read-only: no forms
    # the person is "User" on the shared page as in the app ("Question" there, "You" here, once)
    assert '<div class="role">User</div>' in shared and '<div class="role">User</div>' in page
    assert "Question" not in shared and '<div class="role">You</div>' not in page
    assert "sse-connect" not in shared
    owner.post(f"/chat/c/{cid}/unshare", data={"csrf_token": csrf})
    assert colleague.get(link.group(1)).status_code == 404


# export.json's shape, as it was when messages were read as dicts: every column of the conversation and of each
# message, the branch's messages with which version each is, every version without, a reply's tokens.
CONVERSATION_KEYS = ["id", "owner", "title", "created_at", "updated_at", "leaf_id", "model"]
MESSAGE_KEYS = ["id", "conversation_id", "role", "content", "status", "error", "settings", "tokens", "ttft_seconds",
                "tokens_per_second", "wait_seconds", "created_at", "parent_id", "token_view", "runner", "lease_until",
                "model", "model_file", "model_precision", "intervention"]


def test_export_json_keeps_its_shape(chat_app):
    client = chat_app.test_client()
    cid = send(client, "shape", htmx=False, seed="1", max_new_tokens="5").headers["Location"].rsplit("/", 1)[1]
    csrf = csrf_of(client, f"/chat/c/{cid}")
    client.post(f"/chat/c/{cid}/regenerate", data={"csrf_token": csrf, "seed": "2", "max_new_tokens": "5"})
    assert wait_for(lambda: messages(chat_app, cid)[-1].status == "complete")
    data = json.loads(client.get(f"/chat/c/{cid}/export.json?branches=all").get_data(as_text=True))
    assert list(data) == ["conversation", "messages", "all_messages"]
    assert list(data["conversation"]) == CONVERSATION_KEYS and data["conversation"]["id"] == cid
    question, reply = data["messages"]
    assert list(question) == MESSAGE_KEYS + ["versions", "version"]
    assert list(reply) == MESSAGE_KEYS + ["versions", "version"]
    assert isinstance(reply["tokens"], list)  # a reply's "tokens": each with its odds, in place of their count
    assert reply["version"] == 2 and reply["versions"] == [data["all_messages"][1]["id"], reply["id"]]
    assert isinstance(reply["settings"], dict) and reply["settings"]["seed"] == 2 and reply["intervention"] is None
    assert question["settings"] is None and question["parent_id"] is None and reply["parent_id"] == question["id"]
    assert list(reply["tokens"][0]) == ["id", "text", "p", "p_sampled", "rank"]
    assert [list(m) for m in data["all_messages"]] == [MESSAGE_KEYS] * 3
    assert [m["status"] for m in data["all_messages"]] == ["complete"] * 3
