"""Inside this token: the logit lens and every head's attention at the position that produced a reply's
token, checked against nanoGPT's math written out here, against the token panel's odds, and through the
pages and JSON (ownership, share links, bad indices, models it cannot look into, the job limits)."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
import torch.nn as nn
from torch.nn import functional as F

from tests.chat.test_batch import LONG, alone, drain, requests
from tests.chat.test_generate import tiny
from tests.chat.test_glass import reply
from tests.chat.test_views import send, stream_url
from tests.conftest import csrf_of, make_app, wait_for
from webapp.chat.decode.batched import ChatBatch
from webapp.chat.decode.inside import InsideJobs, InsideRequest, inside_report
from webapp.chat.decode.prefix_cache import prefix_cache_for
from webapp.chat.model.gpt import GPT, GPTConfig
from webapp.chat.model.inside import look_inside
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.model.tokenizer import ByteTokenizer
from webapp.core import InferenceCore, Job
from webapp.core.jobs import DONE


# -- nanoGPT's forward, written out: every row of every attention matrix, nothing of webapp's -----------
def reference(model: GPT, ids: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """-> (residual at the last position after embeddings and each block, per layer the last row of the
    (nh, T, T) attention matrix, lens probabilities (L, V))."""
    sd = {k: v.float() for k, v in model.state_dict().items()}
    c = model.config
    hs = c.n_embd // c.n_head
    T = len(ids)

    def ln(x, name):
        return F.layer_norm(x, (c.n_embd,), sd[f"{name}.weight"], sd.get(f"{name}.bias"), 1e-5)

    def linear(x, name):
        return x @ sd[f"{name}.weight"].T + (sd[f"{name}.bias"] if f"{name}.bias" in sd else 0)

    x = sd["transformer.wte.weight"][ids] + sd["transformer.wpe.weight"][:T]  # (T, C)
    residuals, rows = [x[-1]], []
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for layer in range(c.n_layer):
        p = f"transformer.h.{layer}"
        q, k, v = linear(ln(x, f"{p}.ln_1"), f"{p}.attn.c_attn").split(c.n_embd, dim=1)
        q, k, v = (t.view(T, c.n_head, hs).transpose(0, 1) for t in (q, k, v))  # (nh, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)  # (nh, T, T)
        rows.append(att[:, -1, :])
        y = (att @ v).transpose(0, 1).reshape(T, c.n_embd)
        x = x + linear(y, f"{p}.attn.c_proj")
        x = x + linear(F.gelu(linear(ln(x, f"{p}.ln_2"), f"{p}.mlp.c_fc")), f"{p}.mlp.c_proj")
        residuals.append(x[-1])
    logits = ln(torch.stack(residuals), "transformer.ln_f") @ sd["transformer.wte.weight"].T
    return residuals, rows, logits.softmax(dim=-1)


CONFIG = GPTConfig(block_size=64, vocab_size=300, n_layer=3, n_head=4, n_embd=32)


def small_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(CONFIG).eval()
    with torch.no_grad():
        for p in model.parameters():  # biases and norms off their init, so every term shows
            p.add_(torch.randn_like(p) * 0.05)
    return model


def test_the_lens_and_the_attention_are_nanogpts_math_on_a_tiny_random_gpt():
    model = small_gpt()
    ids = [int(i) for i in torch.randint(0, CONFIG.vocab_size, (37,))]
    want_residuals, want_rows, want_probs = reference(model, ids)
    loaded = tiny_loaded(model)
    report = inside_report(loaded, InsideRequest(tuple(ids), ids[5], 0))
    inside = look_inside(model, torch.tensor([ids]))
    torch.testing.assert_close(inside.residuals, torch.stack(want_residuals), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(report.attention, torch.stack(want_rows), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(report.attention.sum(-1), torch.ones(CONFIG.n_layer, CONFIG.n_head))
    assert len(report.lens) == CONFIG.n_layer + 1
    for row, probs in zip(report.lens, want_probs):
        top = probs.topk(5)
        assert [t for t, _ in row.top] == top.indices.tolist()
        assert [p for _, p in row.top] == pytest.approx(top.values.tolist(), rel=1e-4)
        assert row.chosen_probability == pytest.approx(float(probs[ids[5]]), rel=1e-4)
        assert row.chosen_rank == int((probs > probs[ids[5]]).sum()) + 1


@pytest.mark.parametrize("kept", [25, 10])  # the last 5 positions run in place; the last 20 after a copy
def test_a_kept_kv_cache_gives_the_same_lens_and_attention_as_running_the_whole_context(kept):
    model = small_gpt(1)
    loaded = tiny_loaded(model)
    ids = [int(i) for i in torch.randint(0, CONFIG.vocab_size, (30,))]
    cold = inside_report(loaded, InsideRequest(tuple(ids), ids[0], 0))
    cache = model.new_cache()
    with torch.inference_mode():
        model.forward_cached(torch.tensor([ids[:kept]]), cache, 0, logits=False)
    prefix_cache_for(model).put(cache, ids[:kept])
    warm = inside_report(loaded, InsideRequest(tuple(ids), ids[0], 0))
    assert (cold.reused_positions, warm.reused_positions) == (0, kept)
    torch.testing.assert_close(warm.attention, cold.attention, atol=1e-6, rtol=1e-5)
    for a, b in zip(warm.lens, cold.lens):
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        assert a.chosen_probability == pytest.approx(b.chosen_probability, rel=1e-4)
    assert prefix_cache_for(model).peek(ids)[1] == kept  # read, not taken


def tiny_loaded(model) -> LoadedChatModel:
    return LoadedChatModel(model=model, tokenizer=ByteTokenizer(), block_size=model.config.block_size,
                           supports_kv_cache=True, checkpoint_id="t", description="t", prompt=None)  # type: ignore[arg-type]


# -- a running reply is unchanged by Inside jobs interleaved with it ------------------------------------
def test_running_replies_stay_bit_for_bit_the_same_with_inside_jobs_between_their_steps():
    loaded = tiny(config=LONG, endless=True)
    blocks = list(loaded.model.transformer.h)
    # an Inside job's block takes 20 ms: long enough for the core to let the batch step inside it
    # (a reply's decode step runs the block in one call, never ln_2's module: it is not slowed)
    for block in blocks:
        block.ln_2.register_forward_hook(lambda *a: __import__("time").sleep(0.02))
    reqs = [dataclasses.replace(r, params=dataclasses.replace(r.params, max_new_tokens=60)) for r in requests(4)]
    core = InferenceCore({"chat": loaded}, {"chat": ChatBatch(loaded, 8, 2**30), "inside": InsideJobs(loaded)})
    try:
        replies = [core.submit(Job("chat", f"user{i}", r)) for i, r in enumerate(reqs)]
        assert wait_for(lambda: all(len(getattr(j.result, "token_ids", [])) >= 2 for j in replies), timeout=30)
        insides, during = [], []
        for n in range(3):
            context = tuple((11 * j + n) % 256 for j in range(300))
            job = core.submit(Job("inside", "viewer", InsideRequest(context, 5, 0)))
            assert wait_for(lambda job=job: job.state == "running", timeout=30)
            before = sum(len(j.result.token_ids) for j in replies)
            drain(job)
            during.append(sum(len(j.result.token_ids) for j in replies) - before)
            insides.append(job)
        for job in replies:
            drain(job)
    finally:
        core.shutdown()
    assert all(j.state == DONE for j in insides + replies)
    assert max(during) > 0  # the replies really stepped while an Inside job ran
    for job, request in zip(replies, reqs):
        assert job.result.token_ids == alone(loaded, request)


# -- through the app: the JSON contract, the page, who may see it ---------------------------------------
@pytest.fixture
def chat_app(tmp_path):
    """The tiny test model, made to never stop before max_new_tokens (as tests/chat/test_glass.py's)."""
    from tests.support.chat_models import tiny_chat_model
    loaded = tiny_chat_model(tmp_path / "chat")
    first_special = min(loaded.tokenizer.special_ids.values())
    loaded.model.lm_head.register_forward_hook(lambda m, a, logits: logits.index_fill_(
        -1, torch.arange(first_special, logits.size(-1)), float("-inf")))
    app = make_app(tmp_path, {"chat": loaded})
    yield app
    app.extensions["glassbox.core"].shutdown()


def test_the_json_answers_the_documented_contract_and_its_last_row_is_the_token_panels_odds(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Hello there", max_new_tokens="6", temperature="0.9", top_k="0", seed="4")
    from webapp.chat.web.blueprint import service
    with chat_app.app_context():
        details = service().details(mid)
    odds, prompt = details["odds"], details["prompt"]["ids"]
    config = chat_app.extensions["glassbox.core"].models["chat"].model.config
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
    config = chat_app.extensions["glassbox.core"].models["chat"].model.config
    lens = page[page.index('<table class="lens"'):page.index("</table>")]
    assert lens.count('<th scope="row">') == config.n_layer + 1 and "embeddings" in lens
    assert len(re.findall(r'<td class="cell s\d chosen">', lens)) >= 1  # greedy: the pick is in the top 5
    assert len(re.findall(r'<a class="strip[ "]', page)) == config.n_layer * config.n_head
    assert 'class="head-detail"' not in page
    chosen = client.get(f"{url}?head=2.1").get_data(as_text=True)
    detail = chosen[chosen.index('class="head-detail"'):]
    assert "Block 2, head 1" in detail and detail[:detail.index("</table>")].count("<meter") == 5
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
    chat_app.extensions["glassbox.core"].models["chat"].remote = True
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
        app.extensions["glassbox.core"].shutdown()


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
        app.extensions["glassbox.core"].shutdown()
