"""Issue 31, item 7 on the chat pages: examples a click sends (one sampled hot, so its versions differ)."""

from __future__ import annotations

import html
import re

from tests.chat.web import test_glass
from tests.conftest import csrf_of

chat_app = test_glass.chat_app


def test_the_examples_are_forms_that_send_and_the_sampled_one_is_hot(chat_app):
    from webapp.chat.web.blueprint import service
    client = chat_app.test_client()
    page = client.get("/chat/").get_data(as_text=True)
    examples = re.findall(r'name="content" value="([^"]+)">\s*<input type="hidden" name="temperature" value="([^"]+)">',
                          page)
    assert [t for _, t in examples] == ["0", "0", "1.0"], examples
    assert page.count('class="example"') == 3 and "Regenerate, and the versions differ" in page
    csrf = csrf_of(client, "/chat/")
    content, temperature = examples[2]
    sent = client.post("/chat/send", data={"csrf_token": csrf, "conversation_id": "", "content": html.unescape(content),
                                           "temperature": temperature, "example": "1"})
    assert sent.status_code == 303  # without JavaScript: the conversation's page, once the reply is written
    cid = sent.headers["Location"].rstrip("/").split("/")[-1].split("#")[0]
    with chat_app.app_context():
        question, answer = service().store.messages(cid)[:2]
    assert question.content == "Tell me about a country."
    assert answer.settings["temperature"] == 1.0
    # the example's temperature is its own: the browser's settings stay as they were (it kept 1.2 for ever after)
    greedy = client.post("/chat/send", data={"csrf_token": csrf, "conversation_id": "", "content": "Hi",
                                             "temperature": "0", "example": "1"})
    assert greedy.status_code == 303
    assert "temperature 0.0" not in client.get(greedy.headers["Location"]).get_data(as_text=True)


def test_exports_carry_each_tokens_odds_and_the_seed_it_was_really_sampled_with(chat_app):
    from webapp.chat.decode.generate import generate
    from webapp.chat.web.blueprint import service
    from webapp.web.state import glassbox
    client = chat_app.test_client()
    cid, mid, _ = test_glass.reply(client, "Hello there", max_new_tokens="10", temperature="0.9", top_k="20")
    data = client.get(f"/chat/c/{cid}/export.json").get_json()
    reply = next(m for m in data["messages"] if m["id"] == mid)
    seed = reply["settings"]["seed"]
    assert isinstance(seed, int) and reply["settings"]["seed_drawn"] is True  # none was typed: one was drawn
    with chat_app.app_context():
        details = service().details(mid)
    assert [t["id"] for t in reply["tokens"]] == [row[0] for row in details.odds]
    assert [t["p"] for t in reply["tokens"]] == [row[1] for row in details.odds]
    assert all(0 < t["p"] <= 1 and t["rank"] >= 1 and t["text"] is not None for t in reply["tokens"])
    loaded = glassbox(chat_app).core.models["chat"]
    again = [p.token for p in generate(loaded, details.prompt["ids"], max_new_tokens=10, temperature=0.9, top_k=20,
                                       seed=seed) if p.token is not None]
    assert again == [t["id"] for t in reply["tokens"]]  # the real seed: it gives the same reply
    markdown = client.get(f"/chat/c/{cid}/export.md").get_data(as_text=True)
    assert f"seed {seed}" in markdown and "| # | token id | text | probability | rank |" in markdown
    first = reply["tokens"][0]
    assert f"| 1 | {first['id']} |" in markdown and f"{first['p'] * 100:.2f}%" in markdown


def test_a_shared_conversation_shows_its_tokens_shaded_and_its_prompt_read_only(chat_app):
    from webapp.chat.web.blueprint import service
    client = chat_app.test_client()
    cid, mid, _ = test_glass.reply(client, "Hello there", max_new_tokens="6", temperature="0")
    csrf = csrf_of(client, f"/chat/c/{cid}")
    client.post(f"/chat/c/{cid}/share", data={"csrf_token": csrf})
    link = re.search(r'/chat/shared/([\w-]+)', client.get(f"/chat/c/{cid}").get_data(as_text=True)).group(0)
    stranger = chat_app.test_client()  # another browser: no cookie of the owner's
    page = stranger.get(link).get_data(as_text=True)
    with chat_app.app_context():
        details = service().details(mid)
    assert page.count('<a class="tok s') == 6 and "Shade: the model&#39;s probability" in page
    assert f"{link}/m/{mid}/inside/5" in page and 'name="token"' not in page  # Inside, but no branching
    prompt = stranger.get(f"{link}/m/{mid}/prompt")
    assert prompt.status_code == 200
    text = prompt.get_data(as_text=True)
    assert "Back to the shared conversation" in text and f"/chat/c/{cid}" not in text
    assert text.count('<span class="tokid">') == len(details.prompt["ids"])
    assert stranger.get(f"{link}/m/{mid - 1}/prompt").status_code == 404  # the question has no prompt
    client.post(f"/chat/c/{cid}/unshare", data={"csrf_token": csrf})
    assert stranger.get(f"{link}/m/{mid}/prompt").status_code == 404
