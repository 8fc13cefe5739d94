"""Inside this token through the app: the JSON contract (its last lens row is the token panel's odds), the
page without JavaScript, who may see it (the owner, share links read-only), bad indices, models it cannot
look into (remote, another layout) and the job limits."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn

from tests.chat.web import test_glass
from tests.chat.web.test_conversations import send, stream_url
from tests.chat.web.test_glass import reply
from tests.conftest import csrf_of, make_app
from webapp.chat.model.gpt import GPTConfig
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.model.tokenizer import ByteTokenizer
from webapp.web.state import glassbox

chat_app = test_glass.chat_app  # the fixture: the same tiny model, made to never stop before max_new_tokens


# -- through the app: the JSON contract, the page, who may see it ---------------------------------------
def test_the_json_answers_the_documented_contract_and_its_last_row_is_the_token_panels_odds(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Hello there", max_new_tokens="6", temperature="0.9", top_k="0", seed="4")
    from webapp.chat.web.blueprint import service
    with chat_app.app_context():
        details = service().details(mid)
    odds, prompt = details.odds, details.prompt["ids"]
    config = glassbox(chat_app).core.models["chat"].model.config
    for i, row in enumerate(odds):
        answer = client.get(f"/chat/c/{cid}/m/{mid}/inside/{i}.json")
        assert answer.status_code == 200
        data = answer.get_json()
        assert data["token"]["index"] == i and data["token"]["id"] == row[0]
        assert data["context_ids"] == prompt + [r[0] for r in odds[:i]]
        assert [r["layer"] for r in data["lens"]] == list(range(config.n_layer + 1))
        weights = data["attention"]["weights"]
        assert (data["attention"]["n_layer"], data["attention"]["n_head"]) == (config.n_layer, config.n_head)
        assert len(weights) == config.n_layer and all(len(w) == config.n_head for w in weights)
        for head in (h for layer in weights for h in layer):
            assert len(head) == len(data["context_ids"]) and sum(head) == pytest.approx(1.0, abs=1e-5)
        last = data["lens"][-1]  # the token panel's odds, saved with four significant digits
        assert last["chosen"]["p"] == pytest.approx(row[1], rel=1e-3) and last["chosen"]["rank"] == row[3]
        assert [t["id"] for t in last["top"]] == [alt[0] for alt in row[5][:5]]
        assert [t["p"] for t in last["top"]] == pytest.approx([alt[1] for alt in row[5][:5]], rel=1e-3)
        assert all(set(t) == {"id", "text", "p"} for r in data["lens"] for t in r["top"])


def test_the_page_works_without_javascript_and_lists_a_chosen_heads_positions(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Hello there", max_new_tokens="4", temperature="0")
    tokens = client.get(f"/chat/c/{cid}/m/{mid}/tokens?t=1").get_data(as_text=True)
    url = f"/chat/c/{cid}/m/{mid}/inside/1"
    assert f'href="{url}"' in tokens  # "Inside this token", in the token panel
    page = client.get(url).get_data(as_text=True)  # no HX-Request: the request waits for the job
    config = glassbox(chat_app).core.models["chat"].model.config
    lens = page[page.index('<table class="lens"'):page.index("</table>")]
    assert lens.count('<th scope="row">') == config.n_layer + 1 and "embeddings" in lens
    assert len(re.findall(r'<td class="cell s\d chosen">', lens)) >= 1  # greedy: the pick is in the top 5
    assert len(re.findall(r'<a class="strip[ "]', page)) == config.n_layer * config.n_head
    assert 'class="head-detail"' not in page
    chosen = client.get(f"{url}?head=1.1").get_data(as_text=True)
    detail = chosen[chosen.index('class="head-detail"'):]
    assert "Layer 1, head 1" in detail and detail[:detail.index("</table>")].count("<meter") == 5
    assert "head-detail" not in client.get(f"{url}?head=9.9").get_data(as_text=True)  # no such head: none
    assert f'href="/chat/c/{cid}/m/{mid}/inside/0"' in page and f'href="/chat/c/{cid}/m/{mid}/inside/2"' in page


def test_bad_indices_and_other_browsers_get_404_and_share_links_read_only(chat_app):
    mine, theirs = chat_app.test_client(), chat_app.test_client()
    cid, mid, _ = reply(mine, "private", max_new_tokens="3", temperature="0")
    base = f"/chat/c/{cid}/m/{mid}/inside"
    for path in (f"{base}/0", f"{base}/0.json"):
        assert mine.get(path).status_code == 200
        assert theirs.get(path).status_code == 404
    assert "No such conversation" in theirs.get(f"{base}/0.json").get_json()["error"]  # JSON, for a script
    assert "No such token" in mine.get(f"{base}/3.json").get_json()["error"]
    assert mine.get(f"{base}/3").status_code == 404 and mine.get(f"{base}/-1.json").status_code == 404
    assert mine.get(f"/chat/c/{cid}/m/{mid - 1}/inside/0.json").status_code == 404  # a question has no tokens
    mine.post(f"/chat/c/{cid}/share", data={"csrf_token": csrf_of(mine, f"/chat/c/{cid}")})
    token = re.search(r"/chat/shared/([\w-]+)", mine.get(f"/chat/c/{cid}").get_data(as_text=True)).group(1)
    shared = theirs.get(f"/chat/shared/{token}").get_data(as_text=True)
    assert f"/chat/shared/{token}/m/{mid}/inside/0" in shared
    page = theirs.get(f"/chat/shared/{token}/m/{mid}/inside/0").get_data(as_text=True)
    assert "Inside token 1" in page and "<form" not in page.split("<main", 1)[1].replace('class="theme-form"', "")
    assert theirs.get(f"/chat/shared/{token}/m/{mid}/inside/0.json").get_json() == mine.get(f"{base}/0.json").get_json()
    assert theirs.get(f"/chat/shared/{token}/m/{mid - 1}/inside/0.json").status_code == 404
    mine.post(f"/chat/c/{cid}/unshare", data={"csrf_token": csrf_of(mine, f"/chat/c/{cid}")})
    assert theirs.get(f"/chat/shared/{token}/m/{mid}/inside/0.json").status_code == 404


def test_a_remote_backend_answers_409_with_the_reason(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Hello", max_new_tokens="2")
    glassbox(chat_app).core.models["chat"].remote = True
    answer = client.get(f"/chat/c/{cid}/m/{mid}/inside/0.json")
    assert answer.status_code == 409 and "remote server" in answer.get_json()["error"]
    page = client.get(f"/chat/c/{cid}/m/{mid}/inside/0")
    assert page.status_code == 409 and "remote server" in page.get_data(as_text=True)


class NotNanoGPT(nn.Module):
    """An owner's model with the seed's contract (model(idx) -> (logits, loss), config) and layout of its own."""

    def __init__(self):
        super().__init__()
        self.config = GPTConfig(block_size=512, vocab_size=264, n_layer=1, n_head=1, n_embd=16)
        self.embed, self.head = nn.Embedding(264, 16), nn.Linear(16, 264)

    def forward(self, idx, targets=None):
        logits = self.head(self.embed(idx).cumsum(1))
        logits[..., 256:] = float("-inf")  # never ends early
        return logits, None


def test_a_model_without_nanogpts_layout_says_so_and_the_json_answers_409(tmp_path):
    from webapp.chat.model.prompt import PromptBuilder
    torch.manual_seed(0)
    model = NotNanoGPT().eval()
    tok = ByteTokenizer()
    loaded = LoadedChatModel(model=model, tokenizer=tok, block_size=512, supports_kv_cache=False,
                             checkpoint_id="owner", description="owner factory", prompt=PromptBuilder(tok, 512))
    app = make_app(tmp_path, {"chat": loaded})
    try:
        client = app.test_client()
        sent = send(client, "Hi", max_new_tokens="2")
        client.get(stream_url(sent.get_data(as_text=True))).get_data()
        mid = int(re.search(r"/m/(\d+)/stream", stream_url(sent.get_data(as_text=True))).group(1))
        cid = re.search(r'name="conversation_id" value="([0-9a-f]+)"', sent.get_data(as_text=True)).group(1)
        answer = client.get(f"/chat/c/{cid}/m/{mid}/inside/0.json")
        assert answer.status_code == 409 and "nanoGPT's module layout" in answer.get_json()["error"]
        page = client.get(f"/chat/c/{cid}/m/{mid}/inside/0").get_data(as_text=True)
        assert "cannot look into this model" in page
    finally:
        glassbox(app).core.shutdown()


def test_inside_jobs_count_against_the_browsers_job_limit(tmp_path):
    from tests.support.chat_models import tiny_chat_model
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat", seconds_per_step=0.05)},
                   max_jobs_per_owner=1)
    try:
        client = app.test_client()
        cid, mid, _ = reply(client, "Hello", max_new_tokens="2")
        send(client, "And?", conversation_id=cid, max_new_tokens="200")  # running: the browser's one job
        answer = client.get(f"/chat/c/{cid}/m/{mid}/inside/0.json")
        assert answer.status_code == 429 and answer.get_json()["error"]
    finally:
        glassbox(app).core.shutdown()


# -- issue 31, item 5: a person's token is named as such, with the model's own odds for it -----------------
def test_typed_and_picked_tokens_are_named_as_such_with_the_models_own_odds_and_the_version_says_where(chat_app):
    from webapp.chat.web.blueprint import service
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Hello there", max_new_tokens="8", temperature="0.9", top_k="0", seed="4")
    with chat_app.app_context():
        rows = service().details(mid).odds
    sampled = client.get(f"/chat/c/{cid}/m/{mid}/inside/3").get_data(as_text=True)
    assert "The model chose this token" in sampled and "A person" not in sampled
    assert "branched at token" not in client.get(f"/chat/c/{cid}").get_data(as_text=True)

    csrf = csrf_of(client, f"/chat/c/{cid}")
    other = next(t for t, _, _ in rows[3][5] if t != rows[3][0])  # an alternative the model did not take
    assert client.post(f"/chat/c/{cid}/m/{mid}/branch",
                       data={"csrf_token": csrf, "index": "3", "token": str(other)}).status_code == 303
    with chat_app.app_context():
        picked_id = service().store.messages(cid)[-1].id
    conversation = client.get(f"/chat/c/{cid}").get_data(as_text=True)
    shown = conversation.split(f'id="message-{picked_id}"')[1].split("</li>")[0]
    assert "branched at token 4" in shown
    picked = client.get(f"/chat/c/{cid}/m/{picked_id}/inside/3").get_data(as_text=True)
    assert "A person picked this token" in picked and "it was sampled" not in picked
    assert "The model chose this token" not in picked
    assert "<strong>the model's own odds</strong>" in picked
    kept = client.get(f"/chat/c/{cid}/m/{picked_id}/inside/1").get_data(as_text=True)
    assert "this version kept it" in kept and "branched at token 4" in kept

    assert client.post(f"/chat/c/{cid}/m/{picked_id}/branch",
                       data={"csrf_token": csrf, "index": "2", "text": "ok"}).status_code == 303
    with chat_app.app_context():
        typed_id = service().store.messages(cid)[-1].id
    page = client.get(f"/chat/c/{cid}/m/{typed_id}/inside/2").get_data(as_text=True)
    assert "A person typed this token" in page and "branched at token 3" in page
    assert "it was sampled" not in page and "The model chose" not in page
    own = client.get(f"/chat/c/{cid}/m/{typed_id}/inside/2.json").get_json()["lens"][-1]["chosen"]
    # the model's own odds for the typed token, labelled as that (the JSON's last lens row: its softmax)
    assert f"{own['p'] * 100:.2f}%, rank {own['rank']}" in page
