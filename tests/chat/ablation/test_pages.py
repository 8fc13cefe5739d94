"""Switch parts off through the app: an ablated version is the reference's greedy reply with those parts
switched off (zero and mean), labelled, compared, exported; the form and JSON contracts and their 400s
naming the bad part; who may ask (409s like Regenerate's); one position's odds; the prefix cache never
holds an ablated run's keys."""

from __future__ import annotations

import html
import json
import re
from dataclasses import asdict

import pytest
import torch
from safetensors.torch import save_file

from tests.chat.ablation.test_compute import SPECIALS, listening_gpt, reference, reference_greedy, reference_means
from tests.chat.decode.test_generate import NO_SPECIALS
from tests.chat.web.test_conversations import send, stream_url
from tests.conftest import csrf_of, make_app, sse_events
from webapp.chat.model.gpt import GPTConfig
from webapp.chat.model.loading import load_chat_model
from webapp.web.state import glassbox

CONFIG = GPTConfig(block_size=512, vocab_size=264, n_layer=2, n_head=2, n_embd=32)


@pytest.fixture
def chat_app(tmp_path):
    """A model whose heads matter (tests/chat/ablation/test_compute.py), through the real loader, never
    sampling a special (so every reply runs to max_new_tokens)."""
    model = listening_gpt(CONFIG)
    folder = tmp_path / "chat"
    folder.mkdir()
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({**asdict(CONFIG), "tokenizer": "byte"}))
    loaded = load_chat_model(str(folder / "model.safetensors"))
    loaded.model.lm_head.register_forward_hook(NO_SPECIALS)
    app = make_app(tmp_path, {"chat": loaded})
    yield app
    glassbox(app).core.shutdown()


def state_of(app) -> dict:
    return {k: v.detach().clone() for k, v in glassbox(app).core.models["chat"].model.state_dict().items()}


def store(app):
    from webapp.chat.web.blueprint import service
    with app.app_context():
        return service().store


def greedy_reply(client, content="Hello there", n=10) -> tuple[str, int]:
    sent = send(client, content, max_new_tokens=str(n), temperature="0")
    url = stream_url(sent.get_data(as_text=True))
    assert sse_events(client.get(url).get_data(as_text=True))[-1][0] == "done"
    return url.split("/")[3], int(re.search(r"/m/(\d+)/stream", url).group(1))


def finish(client, cid: str, mid: int) -> None:
    """Read a reply's stream to its end (a reply nobody reads is stopped after a while, as every reply)."""
    assert sse_events(client.get(f"/chat/c/{cid}/m/{mid}/stream").get_data(as_text=True))[-1][0] == "done"


def tokens_of(app, mid: int) -> list[int]:
    return [row[0] for row in store(app).details(mid).odds]


def prompt_of(app, mid: int) -> list[int]:
    return list(store(app).details(mid).prompt["ids"])


# -- the version: the reference's reply, labelled, compared, exported -------------------------------------------
def test_an_ablated_version_is_the_references_greedy_reply_with_those_heads_zeroed(chat_app):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client)
    csrf = csrf_of(client, f"/chat/c/{cid}")
    sent = client.post(f"/chat/c/{cid}/m/{mid}/ablate", data={"csrf_token": csrf, "heads": "1.0, 0.1"})
    assert sent.status_code == 303  # no JavaScript: the form waited for the whole reply
    original = store(chat_app).message(cid, mid)
    versions = [m for m in store(chat_app).all_messages(cid) if m.parent_id == original.parent_id]
    assert [m.id for m in versions][0] == mid and len(versions) == 2
    ablated = versions[1]
    assert ablated.status == "complete" and ablated.settings == original.settings
    assert ablated.intervention == {"heads": ["0.1", "1.0"], "mlps": [], "mode": "zero"}
    assert original.intervention is None
    assert prompt_of(chat_app, ablated.id) == prompt_of(chat_app, mid)  # the exact saved prompt

    state, prompt = state_of(chat_app), prompt_of(chat_app, mid)
    expected = reference_greedy(state, 2, prompt, 10, heads={(1, 0): None, (0, 1): None})
    assert tokens_of(chat_app, ablated.id) == expected
    assert tokens_of(chat_app, mid) == reference_greedy(state, 2, prompt, 10)
    assert expected != tokens_of(chat_app, mid)  # switching them off changed the reply

    page = client.get(f"/chat/c/{cid}").get_data(as_text=True)  # the new version is shown, labelled
    assert re.search(r'class="badge intervention"[^>]*>heads 0\.1, 1\.0 zeroed<', page)
    compare = client.get(f"/chat/c/{cid}/m/{ablated.id}/compare/{mid}").get_data(as_text=True)
    first = next(i for i, (a, b) in enumerate(zip(expected, tokens_of(chat_app, mid))) if a != b)
    said = (f"first differ at token {first + 1}" if first else "They differ from their first token on")
    assert said in compare and "heads 0.1, 1.0 zeroed" in compare

    exported = json.loads(client.get(f"/chat/c/{cid}/export.json?branches=all").get_data(as_text=True))
    records = {m["id"]: m["intervention"] for m in exported["all_messages"]}
    assert records[ablated.id] == {"heads": ["0.1", "1.0"], "mlps": [], "mode": "zero"}
    assert [v for k, v in records.items() if k != ablated.id] == [None] * (len(records) - 1)
    assert exported["messages"][-1]["intervention"] == records[ablated.id]  # the branch shown


def test_a_mean_ablated_version_through_the_json_twin_is_the_references(chat_app):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, "What is a head?", 12)
    answer = client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", json={"heads": ["1.1"], "mlps": [0], "mode": "mean"})
    assert answer.status_code == 200 and set(answer.get_json()) == {"message_id"}
    new = answer.get_json()["message_id"]
    finish(client, cid, new)
    state, prompt = state_of(chat_app), prompt_of(chat_app, mid)
    seen = reference_means(state, 2, prompt)  # over the prompt's positions, from a clean forward
    means = {"heads": {(1, 1): seen[("heads", 1)][1].mean(dim=0)}, "mlps": {0: seen[("mlp", 0)].mean(dim=0)}}
    expected = reference_greedy(state, 2, prompt, 12, **means)
    assert tokens_of(chat_app, new) == expected
    assert expected != reference_greedy(state, 2, prompt, 12, heads={(1, 1): None}, mlps={0: None})
    assert store(chat_app).message(cid, new).intervention == {"heads": ["1.1"], "mlps": [0], "mode": "mean"}

    again = client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", json={"layers": [0], "mode": "zero"})  # a layer
    finish(client, cid, again.get_json()["message_id"])
    assert tokens_of(chat_app, again.get_json()["message_id"]) == reference_greedy(
        state, 2, prompt, 12, heads={(0, 0): None, (0, 1): None})
    record = store(chat_app).message(cid, again.get_json()["message_id"]).intervention
    assert record == {"heads": ["0.0", "0.1"], "mlps": [], "mode": "zero", "layers": [0]}


def test_the_prefix_cache_never_holds_an_ablated_runs_keys(chat_app):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client)
    holder = glassbox(chat_app).core.models["chat"].prefix_cache
    before = [(entry.cache, list(entry.ids)) for entry in holder._entries]
    answer = client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", json={"heads": "0.0", "mlps": "1"})
    new = answer.get_json()["message_id"]
    finish(client, cid, new)
    ablated_ids = prompt_of(chat_app, mid) + tokens_of(chat_app, new)
    assert tokens_of(chat_app, new) != tokens_of(chat_app, mid)
    assert [(entry.cache, list(entry.ids)) for entry in holder._entries] == before  # nothing taken, nothing kept
    assert all(entry.variant is None and entry.ids != ablated_ids[:len(entry.ids)] for entry in holder._entries)


# -- the contracts ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fields, named", [
    ({"heads": "2.0"}, "There is no head 2.0"),
    ({"heads": "1.5"}, "There is no head 1.5"),
    ({"heads": "1.0,abc"}, "'abc' is not a head"),
    ({"mlps": "3"}, "There is no MLP 3"),
    ({"layers": "2"}, "There is no attention layer 2"),
    ({"heads": "1.0", "mode": "half"}, "mode must be zero or mean"),
    ({}, "Choose what to switch off"),
    ({"heads": "", "mlps": ""}, "Choose what to switch off"),
])
def test_bad_parts_get_400_naming_them_and_nothing_is_saved(chat_app, fields, named):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=3)
    csrf = csrf_of(client, f"/chat/c/{cid}")
    kept = len(store(chat_app).all_messages(cid))
    form = client.post(f"/chat/c/{cid}/m/{mid}/ablate", data={"csrf_token": csrf, **fields})
    assert form.status_code == 400 and named in html.unescape(form.get_data(as_text=True))
    as_json = client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", json=fields)
    assert as_json.status_code == 400 and named in as_json.get_json()["error"]
    as_form = client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", data={"csrf_token": csrf, **fields})
    assert as_form.status_code == 400 and named in as_form.get_json()["error"]
    # with JavaScript: the form again, in place, what was typed kept and why beside it (it was a banner out of view)
    htmx = client.post(f"/chat/c/{cid}/m/{mid}/ablate", data={"csrf_token": csrf, **fields},
                       headers={"HX-Request": "true"})
    text = htmx.get_data(as_text=True)
    assert htmx.status_code == 400 and htmx.headers["HX-Retarget"] == f"#ablate-{mid}"
    assert text.lstrip().startswith(f'<details class="ablate" id="ablate-{mid}" open>')
    assert f'<p class="error" id="ablate-{mid}-error" role="alert">' in text and named in html.unescape(text)
    for name, value in fields.items():
        if name != "mode" and value:
            assert f'name="{name}" value="{html.escape(value)}"' in text and 'aria-invalid="true"' in text
    assert len(store(chat_app).all_messages(cid)) == kept


def test_the_json_twin_takes_a_form_with_its_token_and_who_may_ask(chat_app):
    client, stranger = chat_app.test_client(), chat_app.test_client()
    cid, mid = greedy_reply(client, n=3)
    csrf = csrf_of(client, f"/chat/c/{cid}")
    assert client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", data={"heads": "1.0"}).status_code == 403  # no token
    answer = client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", data={"csrf_token": csrf, "heads": "1.0"})
    assert answer.status_code == 200
    finish(client, cid, answer.get_json()["message_id"])
    assert stranger.post(f"/chat/c/{cid}/m/{mid}/ablate.json", json={"heads": "1.0"}).status_code == 404
    question = store(chat_app).message(cid, mid).parent_id
    assert client.post(f"/chat/c/{cid}/m/{question}/ablate.json", json={"heads": "1.0"}).status_code == 404
    assert client.post(f"/chat/c/{cid}/m/99999/ablate.json", json={"heads": "1.0"}).status_code == 404
    assert client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", json=[1]).status_code == 400


def test_a_reply_whose_model_is_not_run_here_or_a_remote_backend_gets_409(chat_app):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=3)
    loaded = glassbox(chat_app).core.models["chat"]
    loaded.remote = True
    try:
        answer = client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", json={"heads": "1.0"})
        assert answer.status_code == 409 and "remote server" in answer.get_json()["error"]
        panel = client.get(f"/chat/c/{cid}/m/{mid}/tokens/0/ablated.json?heads=1.0")
        assert panel.status_code == 409
    finally:
        loaded.remote = False
    with glassbox(chat_app).db.transaction() as db:
        # another model: another name and another file (the same file under another name is the same model)
        db.execute("UPDATE messages SET model = 'gpt2-254m', model_file = 'model.pt@0123456789ab' WHERE id = ?",
                   (mid,))
    answer = client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", json={"heads": "1.0"})
    assert answer.status_code == 409 and "gpt2-254m, which this server does not run" in answer.get_json()["error"]
    csrf = csrf_of(client, f"/chat/c/{cid}")
    assert client.post(f"/chat/c/{cid}/m/{mid}/ablate", data={"csrf_token": csrf, "heads": "1.0"}).status_code == 409


# -- one position with parts switched off ---------------------------------------------------------------------
def test_one_positions_odds_with_a_head_off_are_the_references(chat_app):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=6)
    state, context = state_of(chat_app), prompt_of(chat_app, mid) + tokens_of(chat_app, mid)[:4]
    answer = client.get(f"/chat/c/{cid}/m/{mid}/tokens/4/ablated.json?heads=1.0&mlps=0")
    assert answer.status_code == 200
    data = answer.get_json()
    assert data["token"] == {"index": 4, "id": tokens_of(chat_app, mid)[4], "text": data["token"]["text"]}
    assert data["intervention"] == {"heads": ["1.0"], "mlps": [0], "mode": "zero"}
    for key, edits in (("original", {}), ("ablated", {"heads": {(1, 0): None}, "mlps": {0: None}})):
        probs = reference(state, 2, context, **edits)[:SPECIALS].softmax(dim=-1)
        top = probs.topk(10)
        assert [t["id"] for t in data[key]["top"]] == top.indices.tolist()
        assert [t["p"] for t in data[key]["top"]] == pytest.approx(top.values.tolist(), rel=1e-4)
        assert data[key]["p"] == pytest.approx(float(probs[data["token"]["id"]]), rel=1e-4)
    assert data["original"]["rank"] == 1  # greedy: the reply's token was the first choice
    mean = client.get(f"/chat/c/{cid}/m/{mid}/tokens/4/ablated.json?heads=1.0&mode=mean").get_json()
    seen = reference_means(state, 2, context)  # over the context's positions: prompt and the reply before it
    probs = reference(state, 2, context, heads={(1, 0): seen[("heads", 1)][0].mean(dim=0)})[:SPECIALS].softmax(-1)
    assert mean["ablated"]["p"] == pytest.approx(float(probs[data["token"]["id"]]), rel=1e-4)
    bad = client.get(f"/chat/c/{cid}/m/{mid}/tokens/4/ablated.json?heads=9.9")
    assert bad.status_code == 400 and "There is no head 9.9" in bad.get_json()["error"]
    assert client.get(f"/chat/c/{cid}/m/{mid}/tokens/99/ablated.json?heads=1.0").status_code == 404


def test_the_token_panel_offers_it_and_the_page_works_without_javascript(chat_app):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=4)
    panel = client.get(f"/chat/c/{cid}/m/{mid}/tokens?t=2").get_data(as_text=True)
    url = f"/chat/c/{cid}/m/{mid}/tokens/2/ablated"
    assert f'action="{url}"' in panel and 'name="heads"' in panel and 'value="mean"' in panel
    page = client.get(f"{url}?heads=1.0,0.0&mode=zero").get_data(as_text=True)
    assert "Token 3 with heads 0.0, 1.0 zeroed" in page and page.count("<meter") == 20
    assert "<html" in page.lower()
    fragment = client.get(f"{url}?heads=1.0", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert fragment.lstrip().startswith("<section class=\"ablated-odds\"") and "<html" not in fragment.lower()
    assert client.get(f"{url}?heads=x").status_code == 400
    conversation = client.get(f"/chat/c/{cid}").get_data(as_text=True)  # the reply's own form
    assert f'action="/chat/c/{cid}/m/{mid}/ablate"' in conversation and "Switch parts off" in conversation


# -- the owner's seed format: a torch.save'd state dict (`_orig_mod.` keys), GPT-2's tokenizer ---------------------
GPT2_SPECIALS = 50257


def test_on_a_seed_format_checkpoint_the_contracts_hold_against_the_reference(tmp_path):
    from webapp.chat.model.tokenizer import GPT2_RANKS
    config = GPTConfig(block_size=256, vocab_size=50304, n_layer=2, n_head=2, n_embd=32)
    model = listening_gpt(config)
    path = tmp_path / "chat_seed.pt"
    torch.save({f"_orig_mod.{k}": v for k, v in model.state_dict().items()}, path)
    loaded = load_chat_model(str(path), arch="n_head=2", tokenizer_spec=f"gpt2:{GPT2_RANKS}")
    loaded.model.lm_head.register_forward_hook(
        lambda m, a, logits: logits.index_fill_(-1, torch.arange(GPT2_SPECIALS, logits.size(-1)), float("-inf")))
    app = make_app(tmp_path, {"chat": loaded})
    try:
        client = app.test_client()
        cid, mid = greedy_reply(client, "Hello there", 8)
        state, prompt = state_of(app), prompt_of(app, mid)
        assert tokens_of(app, mid) == reference_greedy(state, 2, prompt, 8, GPT2_SPECIALS)
        answer = client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", json={"heads": "1.0,0.1"})
        new = answer.get_json()["message_id"]
        finish(client, cid, new)
        expected = reference_greedy(state, 2, prompt, 8, GPT2_SPECIALS, heads={(1, 0): None, (0, 1): None})
        assert tokens_of(app, new) == expected and expected != tokens_of(app, mid)
        exported = json.loads(client.get(f"/chat/c/{cid}/export.json").get_data(as_text=True))
        assert exported["messages"][-1]["intervention"] == {"heads": ["0.1", "1.0"], "mlps": [], "mode": "zero"}
        data = client.get(f"/chat/c/{cid}/m/{mid}/tokens/3/ablated.json?mlps=1&mode=mean").get_json()
        context = prompt + tokens_of(app, mid)[:3]
        seen = reference_means(state, 2, context)
        probs = reference(state, 2, context, mlps={1: seen[("mlp", 1)].mean(dim=0)})[:GPT2_SPECIALS].softmax(-1)
        assert [t["id"] for t in data["ablated"]["top"]] == probs.topk(10).indices.tolist()
        assert data["ablated"]["p"] == pytest.approx(float(probs[tokens_of(app, mid)[3]]), rel=1e-4)
    finally:
        glassbox(app).core.shutdown()


def test_a_model_without_nanogpts_layout_gets_409(tmp_path):
    from tests.chat.inside.test_pages import NotNanoGPT
    from webapp.chat.model.loading import LoadedChatModel
    from webapp.chat.model.prompt import PromptBuilder
    from webapp.chat.model.tokenizer import ByteTokenizer
    torch.manual_seed(0)
    tok = ByteTokenizer()
    loaded = LoadedChatModel(model=NotNanoGPT().eval(), tokenizer=tok, block_size=512, supports_kv_cache=False,
                             checkpoint_id="owner", description="owner factory", prompt=PromptBuilder(tok, 512))
    app = make_app(tmp_path, {"chat": loaded})
    try:
        client = app.test_client()
        sent = send(client, "Hi", max_new_tokens="2")
        url = stream_url(sent.get_data(as_text=True))
        client.get(url).get_data()
        cid, mid = url.split("/")[3], int(re.search(r"/m/(\d+)/stream", url).group(1))
        answer = client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", json={"heads": "0.0"})
        assert answer.status_code == 409 and "nanoGPT's module layout" in answer.get_json()["error"]
        panel = client.get(f"/chat/c/{cid}/m/{mid}/tokens/0/ablated.json?heads=0.0")
        assert panel.status_code == 409
    finally:
        glassbox(app).core.shutdown()


def test_a_second_models_reply_is_ablated_by_that_model(tmp_path):
    from tests.chat.web.test_several_models import app_on
    from tests.chat.web.test_several_models import finish as finish_all
    from tests.support.chat_models import tiny_checkpoint
    tiny_checkpoint(tmp_path / "first", seed=1)
    tiny_checkpoint(tmp_path / "second", seed=2)
    path = tmp_path / "models.toml"
    app = app_on(tmp_path, "[models.first]\ncheckpoint = 'first/model.safetensors'\n"
                 "[models.second]\ncheckpoint = 'second/model.safetensors'\n", path)
    try:
        client = app.test_client()
        sent = send(client, "Hello", model="second", max_new_tokens="6", temperature="0")
        finish_all(client, sent.get_data(as_text=True))
        cid = re.search(r'name="conversation_id" value="([0-9a-f]+)"', sent.get_data(as_text=True)).group(1)
        reply = [m for m in store(app).all_messages(cid) if m.role == "assistant"][-1]
        second = glassbox(app).core.models["chat:second"]
        state = {k: v.detach().clone() for k, v in second.model.state_dict().items()}
        answer = client.post(f"/chat/c/{cid}/m/{reply.id}/ablate.json", json={"mlps": "0", "mode": "mean"})
        new = answer.get_json()["message_id"]
        finish(client, cid, new)
        assert store(app).message(cid, new).model == "second"
        odds = store(app).details(reply.id).odds
        assert odds  # the position's odds are the second model's
        data = client.get(f"/chat/c/{cid}/m/{reply.id}/tokens/0/ablated.json?mlps=0").get_json()
        probs = reference(state, 2, prompt_of(app, reply.id)).softmax(-1)
        assert data["original"]["p"] == pytest.approx(float(probs[odds[0][0]]), rel=1e-4)
    finally:
        glassbox(app).core.shutdown()
