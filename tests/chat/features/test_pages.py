"""A reply's token's features through the app: each dictionary's activations at the position that produced the
token equal its encode, written out by hand, of the residual stream there (a forward written out by hand),
strongest first, labelled; share links read them too; a model without a dictionary, or a dictionary that does
not fit the model, says so."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from markupsafe import escape

from tests.chat.ablation import test_pages as test_ablation
from tests.chat.ablation.test_pages import CONFIG, finish, greedy_reply, prompt_of, tokens_of
from tests.chat.steering.test_pages import by_hand, gpt
from tests.conftest import csrf_of
from webapp.chat import boot
from webapp.chat.features import saelens
from webapp.chat.features.dictionaries import load_dictionaries
from webapp.chat.features.pages import PANEL_FEATURES
from webapp.chat.features.sae import Dictionary, DictionaryConfig
from webapp.chat.features.service import FeatureService
from webapp.chat.model.errors import ModelLoadError
from webapp.chat.service import ChatService
from webapp.config import Settings
from webapp.web.state import glassbox

chat_app = test_ablation.chat_app  # the fixture: a model whose heads matter, never sampling a special


def dictionary(folder, layer: int, d_in: int = CONFIG.n_embd, seed: int = 0) -> Dictionary:
    torch.manual_seed(seed)
    sae = Dictionary(DictionaryConfig(d_in, 48, "topk", 6, layer, model_name="glassbox"))
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.5)
    saelens.save(sae, folder)
    return sae


def with_early_dictionary(app, folder):
    """The app's model with one dictionary, "early", after block 0, loaded as start-up loads one -> the model."""
    loaded = glassbox(app).core.models["chat"]
    dictionary(folder / "early", 0)
    loaded.dictionaries = load_dictionaries(str(folder / "early"), "", loaded.model, loaded.tokenizer)
    return loaded


@pytest.mark.parametrize("loaded_when", ["before the reply", "after the reply"])
def test_a_tokens_features_are_each_dictionarys_encode_of_the_stream_there(chat_app, tmp_path, loaded_when):
    """Read by the decode step that sampled the token and saved with the reply, or (a dictionary loaded since) by
    a job: the same numbers either way."""
    loaded = glassbox(chat_app).core.models["chat"]
    saes = {name: dictionary(tmp_path / name, layer, seed=layer) for name, layer in (("early", 0), ("late", 1))}
    client = chat_app.test_client()
    if loaded_when == "after the reply":
        cid, mid = greedy_reply(client, n=5)
    loaded.dictionaries = load_dictionaries(f"{tmp_path / 'early'},{tmp_path / 'late'}", "", loaded.model,
                                            loaded.tokenizer)
    if loaded_when == "before the reply":
        cid, mid = greedy_reply(client, n=5)
    saved = glassbox(chat_app).service(ChatService).details(mid).features
    assert (saved is None) == (loaded_when == "after the reply")
    index = 3
    got = client.get(f"/chat/c/{cid}/m/{mid}/features/{index}.json")
    assert got.status_code == 200, got.get_json()
    data = got.get_json()
    assert [d["name"] for d in data["dictionaries"]] == ["early", "late"]
    context = prompt_of(chat_app, mid) + tokens_of(chat_app, mid)[:index]
    streams = by_hand(gpt(chat_app), context)
    for reading in data["dictionaries"]:
        sae = saes[reading["name"]]
        assert reading["hook_name"] == sae.config.hook_name
        x = streams[sae.config.layer][-1]  # after its block, at the position that produced token `index`
        t = {k: v.detach() for k, v in sae.state_dict().items()}
        pre = torch.relu((x - t["b_dec"]) @ t["W_enc"] + t["b_enc"])
        kth = pre.topk(6).values[-1]
        want = {int(i): float(pre[i]) for i in torch.nonzero((pre >= kth) & (pre > 0))[:, 0]}
        listed = {f["index"]: f["activation"] for f in reading["features"]}
        assert listed.keys() == want.keys()
        for i, a in want.items():
            assert listed[i] == pytest.approx(a, abs=1e-4)
        activations = [f["activation"] for f in reading["features"]]
        assert activations == sorted(activations, reverse=True)
        assert all(f["label"].startswith("pushes ") for f in reading["features"])


def test_a_model_without_a_dictionary_says_how_to_make_one(chat_app):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=3)
    got = client.get(f"/chat/c/{cid}/m/{mid}/features/0.json")
    assert got.status_code == 409 and "python -m webapp.features train" in got.get_json()["error"]


def test_a_dictionary_that_does_not_fit_stops_start_up_naming_it(tmp_path):
    dictionary(tmp_path / "narrow", 1, d_in=CONFIG.n_embd)
    settings = Settings(chat_dictionaries=str(tmp_path / "narrow"))  # the bundled model is 256 wide
    with pytest.raises(ModelLoadError, match="narrow: d_in is 32, the model's width is 256"):
        boot.load_models(settings)
    deep = tmp_path / "deep"
    saelens.save(Dictionary(DictionaryConfig(256, 8, "topk", 2, 9)), deep)
    with pytest.raises(ModelLoadError, match="reads block 9; the model has blocks 0 to 3"):
        boot.load_models(Settings(chat_dictionaries=str(deep)))
    cfg = json.loads((deep / "cfg.json").read_text())
    (deep / "cfg.json").write_text(json.dumps({**cfg, "architecture": "gated"}))
    with pytest.raises(ModelLoadError, match="architecture 'gated' is not one Glassbox reads"):
        boot.load_models(Settings(chat_dictionaries=str(deep)))


def test_a_registry_lists_a_models_dictionaries(tmp_path):
    saelens.save(Dictionary(DictionaryConfig(256, 16, "topk", 2, 1)), tmp_path / "dicts" / "mine")
    registry = tmp_path / "models.toml"
    bundled = Settings().chat_checkpoint
    registry.write_text(f'[models.small]\ncheckpoint = "{bundled}"\ndictionaries = ["dicts/mine"]\n')
    models = boot.load_models(Settings(chat_models=str(registry)))
    assert list(models.get("small").dictionaries) == ["mine"]


def test_a_features_decoder_row_becomes_a_direction_after_its_block(chat_app, tmp_path):
    loaded = glassbox(chat_app).core.models["chat"]
    sae = dictionary(tmp_path / "early", 0)
    loaded.dictionaries = load_dictionaries(str(tmp_path / "early"), "", loaded.model, loaded.tokenizer)
    client = chat_app.test_client()
    made = client.post("/chat/directions.json", json={"model": "glassbox", "name": "f7",
                                                      "feature": {"dictionary": "early", "index": 7}})
    assert made.status_code == 201, made.get_json()
    got = made.get_json()
    assert got["layer"] == 0 and got["made"]["kind"] == "feature" and got["made"]["label"].startswith("pushes")
    torch.testing.assert_close(torch.tensor(got["vector"]), sae.W_dec[7].detach())
    for feature, words in [({"dictionary": "early", "index": 48}, "features 0 to 47"),
                           ({"dictionary": "late", "index": 1}, "no dictionary 'late'"),
                           ({"index": 1}, "feature must be")]:
        bad = client.post("/chat/directions.json", json={"model": "glassbox", "name": "x", "feature": feature})
        assert bad.status_code == 400 and words in bad.get_json()["error"]


def test_the_features_page_lists_them_and_the_token_panel_links_to_it(chat_app, tmp_path):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=4)
    panel = client.get(f"/chat/c/{cid}/m/{mid}/tokens?t=1").get_data(as_text=True)
    assert "Features here" not in panel  # no dictionary: no link
    missing = client.get(f"/chat/c/{cid}/m/{mid}/features/1")
    assert missing.status_code == 409 and "python -m webapp.features train" in missing.get_data(as_text=True)
    with_early_dictionary(chat_app, tmp_path)
    panel = client.get(f"/chat/c/{cid}/m/{mid}/tokens?t=1").get_data(as_text=True)
    assert f"/chat/c/{cid}/m/{mid}/features/1" in panel
    page = client.get(f"/chat/c/{cid}/m/{mid}/features/1").get_data(as_text=True)
    data = client.get(f"/chat/c/{cid}/m/{mid}/features/1.json").get_json()["dictionaries"][0]
    assert "early" in page and "blocks.0.hook_resid_post" in page
    for feature in data["features"]:
        assert f"/chat/features/glassbox/early/{feature['index']}\">{feature['index']}</a>" in page
        assert f"{feature['activation']:.3f}" in page
    csrf = csrf_of(client, f"/chat/c/{cid}")
    client.post(f"/chat/c/{cid}/share", data={"csrf_token": csrf})
    shared = re.search(r"/chat/shared/([\w-]+)", client.get(f"/chat/c/{cid}").get_data(as_text=True)).group(1)
    read_only = client.get(f"/chat/shared/{shared}/m/{mid}/features/1")
    assert read_only.status_code == 200 and "early" in read_only.get_data(as_text=True)


def test_clamping_a_feature_is_the_formula_at_every_position(chat_app, tmp_path):
    """x ← x + (a* − a_f(x)) · W_dec[f] after the dictionary's block at every position (Templeton et al.): the
    clamped version's greedy reply equals a hand-written loop doing that, and its record says what was clamped."""
    loaded = glassbox(chat_app).core.models["chat"]
    sae = dictionary(tmp_path / "early", 0)
    loaded.dictionaries = load_dictionaries(str(tmp_path / "early"), "", loaded.model, loaded.tokenizer)
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=6)
    feature, value = 3, 40.0
    sent = client.post(f"/chat/c/{cid}/m/{mid}/steer.json",
                       json={"steer": [{"feature": {"dictionary": "early", "index": feature}, "clamp": value}]})
    assert sent.status_code == 200, sent.get_json()
    new = sent.get_json()["message_id"]
    test_ablation.finish(client, cid, new)
    t = {k: v.detach() for k, v in sae.state_dict().items()}

    def clamp(x: torch.Tensor) -> torch.Tensor:
        pre = torch.relu((x - t["b_dec"]) @ t["W_enc"] + t["b_enc"])  # (T, d_sae)
        kth = pre.topk(6, dim=-1).values[:, -1:]
        a = torch.where(pre >= kth, pre, torch.zeros_like(pre))[:, feature]  # (T,)
        return x + (value - a)[:, None] * t["W_dec"][feature]

    ids = list(prompt_of(chat_app, mid))
    want = []
    for _ in range(6):
        logits = by_hand(gpt(chat_app), ids, change=lambda layer, x: clamp(x) if layer == 0 else x)[-1][-1]
        logits[256:] = float("-inf")
        want.append(int(logits.argmax()))
        ids.append(want[-1])
    assert tokens_of(chat_app, new) == want
    assert tokens_of(chat_app, mid) != want  # the clamp changed the reply (else the test shows nothing)
    exported = json.loads(client.get(f"/chat/c/{cid}/export.json").get_data(as_text=True))
    record = next(m for m in exported["messages"] if m["id"] == new)["intervention"]
    assert record == {"kind": "steer", "directions": [],
                      "clamps": [{"dictionary": "early", "feature": feature, "layer": 0, "value": value}]}
    assert "feature early/3 clamped to 40" in client.get(f"/chat/c/{cid}").get_data(as_text=True)
    bad = client.post(f"/chat/c/{cid}/m/{mid}/steer.json",
                      json={"steer": [{"feature": {"dictionary": "early", "index": 3}, "clamp": float("nan")}]})
    assert bad.status_code == 400 and "clamp must be a finite number" in bad.get_json()["error"]


def test_a_features_page_has_its_label_pushes_density_and_top_contexts(chat_app, tmp_path):
    from webapp.chat.features import contexts
    loaded = glassbox(chat_app).core.models["chat"]
    sae = dictionary(tmp_path / "early", 0)
    seqs = [[256] + [(7 * i + 3 * j) % 250 for j in range(30)] for i in range(6)]
    stats = contexts.feature_contexts(loaded.model, sae, seqs, top=4, window=3, batch=4)
    contexts.save(stats, tmp_path / "early")
    loaded.dictionaries = load_dictionaries(str(tmp_path / "early"), "", loaded.model, loaded.tokenizer)
    # by hand: every token's activations after block 0 (the start token left out)
    rows = torch.cat([sae.encode(by_hand(gpt(chat_app), s)[0][1:]).detach() for s in seqs])  # (6 * 30, 48)
    assert stats["tokens"] == 180
    torch.testing.assert_close(torch.tensor(stats["density"]), (rows > 0).float().mean(0))
    feature = int((rows > 0).sum(0).argmax())
    strongest = rows[:, feature].topk(4).values
    assert [p["activation"] for p in stats["top"][feature]] == pytest.approx(strongest.tolist(), rel=1e-4)
    place = int(rows[:, feature].argmax())
    s, p = divmod(place, 30)
    first = stats["top"][feature][0]
    assert first["tokens"][first["at"]] == seqs[s][p + 1] and len(first["tokens"]) <= 7
    client = chat_app.test_client()
    data = client.get(f"/chat/features/glassbox/early/{feature}.json").get_json()
    assert data["index"] == feature and data["label"].startswith("pushes ")
    assert data["density"] == pytest.approx(float((rows[:, feature] > 0).float().mean()))
    assert len(data["pushes"]) == 10 and data["pushes"][0]["logit"] >= data["pushes"][-1]["logit"]
    assert [c["activation"] for c in data["top_contexts"]] == pytest.approx(strongest.tolist(), rel=1e-4)
    # its histogram: every activation where it is active, binned on the log scale by hand
    active = rows[:, feature][rows[:, feature] > 0]
    edges = torch.tensor(data["histogram"]["edges"])
    assert len(edges) == contexts.HISTOGRAM_BINS + 1 and float(edges[0]) == pytest.approx(1e-3)
    bins = contexts.HISTOGRAM_BINS
    binned = [0] * bins
    for value in active.tolist():  # 0.001 to 100: five decades, bins of equal width in log10
        binned[min(max(int((math.log10(value) + 3) / 5 * bins), 0), bins - 1)] += 1
    assert data["histogram"]["counts"] == binned and sum(binned) == int((rows[:, feature] > 0).sum())
    # the tokens it pushes down: its decoder row through ln_f's scale and lm_head, the most negative first
    model = gpt(chat_app)
    effects = (sae.W_dec[feature].detach() * model.transformer.ln_f.weight.detach()) @ model.lm_head.weight.detach().T
    assert [p["logit"] for p in data["pulls"]] == pytest.approx(effects.topk(10, largest=False).values.tolist(),
                                                                rel=1e-4, abs=1e-5)
    page = client.get(f"/chat/features/glassbox/early/{feature}").get_data(as_text=True)
    assert "<mark>" in page and data["label"].replace("'", "&#39;") in page
    assert 'aria-label="Activation histogram"' in page and page.count('class="hbar"') == contexts.HISTOGRAM_BINS
    assert "<caption>Down</caption>" in page
    assert client.get("/chat/features/glassbox/early/48.json").status_code == 404
    assert client.get("/chat/features/glassbox/nope/1.json").status_code == 404


def test_the_features_of_a_clamped_version_read_the_clamped_model(chat_app, tmp_path):
    with_early_dictionary(chat_app, tmp_path)
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=4)
    new = client.post(f"/chat/c/{cid}/m/{mid}/steer.json", json={"steer": [
        {"feature": {"dictionary": "early", "index": 5}, "clamp": 30.0}]}).get_json()["message_id"]
    test_ablation.finish(client, cid, new)
    features = client.get(f"/chat/c/{cid}/m/{new}/features/2.json").get_json()["dictionaries"][0]["features"]
    assert {f["index"]: f["activation"] for f in features}.get(5) == pytest.approx(30.0, rel=0.2)


def test_the_token_panel_shows_the_features_read_as_the_reply_was_written_without_a_job(chat_app, tmp_path,
                                                                                          monkeypatch):
    with_early_dictionary(chat_app, tmp_path)
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=4)

    def no_job(*args, **kwargs):
        raise AssertionError("a token whose features were saved with its reply started a job")
    monkeypatch.setattr(FeatureService, "start", no_job)
    data = client.get(f"/chat/c/{cid}/m/{mid}/features/2.json").get_json()["dictionaries"][0]
    strongest = data["features"][:PANEL_FEATURES]
    assert strongest, "the test's dictionary reads something at every position"
    panel = client.get(f"/chat/c/{cid}/m/{mid}/tokens/2").get_data(as_text=True)
    assert "<h3>Features here</h3>" in panel and "Strongest in early (blocks.0.hook_resid_post)" in panel
    shown = re.findall(r'/chat/features/glassbox/early/(\d+)">', panel)
    assert [int(i) for i in shown] == [f["index"] for f in strongest]
    for f in strongest:
        assert str(escape(f["label"])) in panel
        assert f"{f['activation']:.3f}" in panel
    csrf = csrf_of(client, f"/chat/c/{cid}")
    client.post(f"/chat/c/{cid}/share", data={"csrf_token": csrf})
    shared = re.search(r"/chat/shared/([\w-]+)", client.get(f"/chat/c/{cid}").get_data(as_text=True)).group(1)
    read_only = client.get(f"/chat/shared/{shared}/m/{mid}/tokens?t=2").get_data(as_text=True)
    assert re.findall(r'/chat/features/glassbox/early/(\d+)">', read_only) == shown


def test_a_version_with_parts_switched_off_keeps_no_features_so_a_token_reads_one_model(chat_app, tmp_path):
    with_early_dictionary(chat_app, tmp_path)
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=4)
    answer = client.post(f"/chat/c/{cid}/m/{mid}/ablate.json", json={"heads": ["1.1"], "mlps": [0], "mode": "zero"})
    assert answer.status_code == 200, answer.get_json()
    ablated = answer.get_json()["message_id"]
    finish(client, cid, ablated)
    chat = glassbox(chat_app).service(ChatService)
    assert chat.details(mid).features is not None and chat.details(ablated).features is None
    got = client.get(f"/chat/c/{cid}/m/{ablated}/features/1.json")
    assert got.status_code == 200 and got.get_json()["dictionaries"][0]["name"] == "early"  # read by a job


def test_a_features_page_lists_the_readers_own_replies_where_it_fired_and_no_one_elses(chat_app, tmp_path):
    with_early_dictionary(chat_app, tmp_path)
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=5)
    read = client.get(f"/chat/c/{cid}/m/{mid}/features/3.json").get_json()["dictionaries"][0]["features"]
    feature = read[0]["index"]
    every = {i: client.get(f"/chat/c/{cid}/m/{mid}/features/{i}.json").get_json()["dictionaries"][0]["features"]
             for i in range(5)}
    want = max(((i, f["activation"]) for i, fs in every.items() for f in fs if f["index"] == feature),
               key=lambda hit: hit[1])
    page = client.get(f"/chat/features/glassbox/early/{feature}.json").get_json()
    assert [(p["message_id"], p["token"]) for p in page["fired_in"]] == [(mid, want[0])]
    assert page["fired_in"][0]["activation"] == pytest.approx(want[1])
    html = client.get(f"/chat/features/glassbox/early/{feature}").get_data(as_text=True)
    assert f"/chat/c/{cid}/m/{mid}/tokens?t={want[0]}#token-panel" in html
    stranger = chat_app.test_client()  # another browser: another owner
    assert stranger.get(f"/chat/features/glassbox/early/{feature}.json").get_json()["fired_in"] == []


def test_statistics_that_are_not_of_the_dictionary_are_left_out_not_a_500(chat_app, tmp_path):
    from webapp.chat.features import contexts
    loaded = glassbox(chat_app).core.models["chat"]
    dictionary(tmp_path / "early", 0)
    (tmp_path / "early" / contexts.FILE).write_text(json.dumps({"tokens": 5, "density": [0.5] * 3, "top": [[]] * 3}))
    loaded.dictionaries = load_dictionaries(str(tmp_path / "early"), "", loaded.model, loaded.tokenizer)
    client = chat_app.test_client()
    data = client.get("/chat/features/glassbox/early/40.json").get_json()  # 48 features, statistics of 3
    assert (data["density"], data["top_contexts"], data["histogram"]) == (None, None, None)
    (tmp_path / "early" / contexts.FILE).write_text(json.dumps(
        {"tokens": 5, "density": [0.5] * 48, "top": [[]] * 48, "histogram": {"edges": [1, 2], "counts": [[1]] * 48}}))
    loaded.dictionaries = load_dictionaries(str(tmp_path / "early"), "", loaded.model, loaded.tokenizer)
    data = client.get("/chat/features/glassbox/early/40.json").get_json()
    assert data["density"] == 0.5 and data["histogram"] is None  # the damaged histogram alone is left out
    assert client.get("/chat/features/glassbox/early/40").status_code == 200


def test_the_presenters_token_features_and_feature_pages_are_shown_to_the_followers(chat_app, tmp_path):
    """Issue 51: a token's features and a feature's page, opened by the presenter, on every follower's screen;
    the token's read from the presenter's kept reading (no job for the followers), the feature's page as it is
    (anyone may open it)."""
    from tests.chat.web.test_present import present
    from tests.chat.web.test_presenter_view import state_of
    client, follower = chat_app.test_client(), chat_app.test_client()
    cid, mid = greedy_reply(client, n=4)
    with_early_dictionary(chat_app, tmp_path)
    link = present(client, cid)
    token = link.rsplit("/", 1)[1]
    assert client.get(f"/chat/c/{cid}/m/{mid}/features/1").status_code == 200
    assert state_of(chat_app, link) == {"view": "page", "message": str(mid), "path": "features/1",
                                        "label": "the features of token 2"}
    jobs = len(glassbox(chat_app).core._jobs)
    twin = follower.get(f"/chat/shared/{token}/m/{mid}/features/1")
    assert twin.status_code == 200 and "blocks.0.hook_resid_post" in twin.get_data(as_text=True)
    assert len(glassbox(chat_app).core._jobs) == jobs
    unseen = follower.get(f"/chat/shared/{token}/m/{mid}/features/2")  # not opened: shown nothing, no job
    assert unseen.status_code == 409 and len(glassbox(chat_app).core._jobs) == jobs
    index = client.get(f"/chat/c/{cid}/m/{mid}/features/1.json").get_json()["dictionaries"][0]["features"][0]["index"]
    url = f"/chat/features/glassbox/early/{index}"
    assert client.get(url).status_code == 200
    assert state_of(chat_app, link) == {"view": "page", "url": url, "label": f"feature {index} of early"}
    page = follower.get(link).get_data(as_text=True)
    assert f'data-view="{url}"' in page and f"<strong>feature {index} of early</strong>" in page
    assert follower.get(url).status_code == 200
    assert client.get("/chat/features/glassbox/early/999").status_code == 404
    assert state_of(chat_app, link)["url"] == url  # an error page is not shown to the room


def test_a_feature_page_opened_while_a_session_shows_the_loop_lab_is_shown_there(chat_app, tmp_path):
    """Issue 51: a presenting session shows the Loop lab, the presenter opens a feature's page (a page of no
    conversation): the lab's followers see it, as a conversation's would."""
    from tests.web.test_follow_session import start_session
    client, follower = chat_app.test_client(), chat_app.test_client()
    cid, mid = greedy_reply(client, n=4)
    with_early_dictionary(chat_app, tmp_path)
    link = start_session(client, "/loops/")
    index = client.get(f"/chat/c/{cid}/m/{mid}/features/1.json").get_json()["dictionaries"][0]["features"][0]["index"]
    assert "Loop lab, live" in follower.get(link).get_data(as_text=True)
    url = f"/chat/features/glassbox/early/{index}"
    assert client.get(url).status_code == 200
    page = follower.get(link).get_data(as_text=True)
    assert "Loop lab, live" in page and f'data-view="{url}"' in page
    assert f"<strong>feature {index} of early</strong>" in page
