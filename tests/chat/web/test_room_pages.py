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
    assert [t for _, t in examples] == ["0", "0", "1.2"], examples
    assert page.count('class="example"') == 3 and "Regenerate, and the versions differ" in page
    csrf = csrf_of(client, "/chat/")
    content, temperature = examples[2]
    sent = client.post("/chat/send", data={"csrf_token": csrf, "conversation_id": "", "content": html.unescape(content),
                                           "temperature": temperature})
    assert sent.status_code == 303  # without JavaScript: the conversation's page, once the reply is written
    cid = sent.headers["Location"].rstrip("/").split("/")[-1].split("#")[0]
    with chat_app.app_context():
        question, answer = service().store.messages(cid)[:2]
    assert question["content"] == "Write a short poem about the sea."
    assert answer["settings"]["temperature"] == 1.2
