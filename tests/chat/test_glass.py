"""The glass-box views of a reply: its tokens with their odds, and the exact prompt the model was given."""

from __future__ import annotations

import html as html_lib
import re

import torch

import pytest

from tests.chat.test_views import conversation_id_of, send, stream_url
from tests.conftest import make_app, sse_events


@pytest.fixture
def chat_app(tmp_path):
    """The tiny test model, made to never stop before max_new_tokens (so every reply has tokens)."""
    from tests.support.chat_models import tiny_chat_model
    loaded = tiny_chat_model(tmp_path / "chat")
    first_special = min(loaded.tokenizer.special_ids.values())
    loaded.model.lm_head.register_forward_hook(lambda m, a, logits: logits.index_fill_(
        -1, torch.arange(first_special, logits.size(-1)), float("-inf")))
    app = make_app(tmp_path, {"chat": loaded})
    yield app
    app.extensions["glassbox.core"].shutdown()


def reply(client, content, **fields):
    """Send, stream the reply to its end -> (conversation id, reply id, SSE events)."""
    sent = send(client, content, **fields)
    assert sent.status_code == 200, sent.get_data(as_text=True)[:300]
    url = stream_url(sent.get_data(as_text=True))
    events = sse_events(client.get(url).get_data(as_text=True))
    assert events[-1][0] == "done"
    return conversation_id_of(sent), int(re.search(r"/m/(\d+)/stream", url).group(1)), events


def test_the_token_view_shows_every_token_with_its_odds_and_a_panel_without_javascript(chat_app):
    client = chat_app.test_client()
    cid, mid, events = reply(client, "Hello there", max_new_tokens="12", temperature="0.8", top_k="20", seed="3")
    tokens_url = f"/chat/c/{cid}/m/{mid}/tokens"
    assert tokens_url in client.get(f"/chat/c/{cid}").get_data(as_text=True)  # linked from the reply
    page = client.get(tokens_url).get_data(as_text=True)
    spans = re.findall(r'<a class="tok s(\d)[^"]*" id="token-(\d+)"', page)
    from webapp.chat.views import service
    with chat_app.app_context():
        saved = service().store.message(cid, mid)
        odds = service().store.details(mid)["odds"]
    assert len(spans) == saved["tokens"] == len(odds) and saved["tokens"] >= 1
    assert [int(i) for _, i in spans] == list(range(len(odds)))
    assert [int(s) for s, _ in spans] == [min(9, int(row[1] * 10)) for row in odds]
    # streamed live too: one span per token, with its probability, as the reply arrived
    streamed = "".join(data for name, data in events if name == "token")
    assert len(re.findall(r'<span class="tok s\d" title="[\d.]+%">', streamed)) == saved["tokens"]

    chosen = client.get(f"{tokens_url}?t=0").get_data(as_text=True)  # the no-JS way: a link per token
    assert 'id="token-panel"' in chosen and "Token 1:" in chosen and chosen.count("<meter") == 10
    assert "(chosen)" in chosen or odds[0][3] > 10  # the pick is among the ten unless it ranked lower
    panel = client.get(f"{tokens_url}/0", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert panel.startswith("<section") and "entropy" in panel and "<html" not in panel
    assert client.get(f"{tokens_url}/{len(odds)}").status_code == 404


def test_the_prompt_view_lists_exactly_the_ids_the_model_received(chat_app):
    client = chat_app.test_client()
    core = chat_app.extensions["glassbox.core"]
    cid, first, _ = reply(client, "x" * 200, max_new_tokens="5", temperature="0")
    # a second turn asking for a long reply: the 202-token first turn no longer fits the 512-token window
    sent = send(client, "And now?", conversation_id=cid, max_new_tokens="150", temperature="0")
    url = stream_url(sent.get_data(as_text=True))
    second = int(re.search(r"/m/(\d+)/stream", url).group(1))
    given = list(core.find("chat", second).request.prompt_ids)  # what the generator was given
    client.get(url).get_data()
    page = client.get(f"/chat/c/{cid}/m/{second}/prompt").get_data(as_text=True)
    shown = [int(i) for i in re.findall(r'<span class="tokid">(\d+)</span>', page)]
    assert shown == given
    assert "Left out to fit the window" in page and html_lib.escape("x" * 200) in page
    fewshot = chat_app.extensions["glassbox.core"].models["chat"].prompt.fewshot_ids
    assert f"512 − 150 − 2 − {len(fewshot)} = <strong>{512 - 150 - 2 - len(fewshot)}</strong>" in page
    assert "earlier turn" in page and "Few-shot example" in page and "The reply starts here" in page


def test_glass_views_belong_to_the_browser_that_made_the_reply(chat_app):
    mine, theirs = chat_app.test_client(), chat_app.test_client()
    cid, mid, _ = reply(mine, "private", max_new_tokens="3")
    for path in (f"/chat/c/{cid}/m/{mid}/tokens", f"/chat/c/{cid}/m/{mid}/tokens/0", f"/chat/c/{cid}/m/{mid}/prompt"):
        assert mine.get(path).status_code == 200
        assert theirs.get(path).status_code == 404
    assert mine.get(f"/chat/c/{cid}/m/{mid - 1}/tokens").status_code == 404  # the question has no tokens
