"""Steering through the app: a contrastive direction equals the mean difference worked out by hand; a steered
version is the greedy reply of a plain PyTorch loop that adds α·v after block L at every position; its record
in export.json and its label; the llama.cpp control vector round trip; every bad input a 4xx naming what is
wrong; the prefix cache never hands a steered run's keys to a plain one."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from tests.chat.ablation import test_pages as test_ablation
from tests.chat.ablation.test_pages import CONFIG, finish, greedy_reply, prompt_of, tokens_of
from tests.conftest import csrf_of
from webapp.chat.steering.compute import read_control_vector
from webapp.web.state import glassbox

chat_app = test_ablation.chat_app  # the fixture: a model whose heads matter, never sampling a special


def gpt(app):
    return glassbox(app).core.models["chat"].model


def by_hand(model, ids: list[int], add: tuple[int, torch.Tensor] | None = None, change=None) -> list[torch.Tensor]:
    """nanoGPT's forward written out from the state dict -> the residual stream after each block, (T, C) each,
    the vector added after block add[0] (and change(layer, x) applied after every block); and the logits as the
    last entry."""
    sd = {k: v.float() for k, v in model.state_dict().items()}
    C, nh, T = CONFIG.n_embd, CONFIG.n_head, len(ids)
    hs = C // nh

    def ln(x, name):
        return F.layer_norm(x, (C,), sd[f"{name}.weight"], sd[f"{name}.bias"], 1e-5)

    def linear(x, name):
        return x @ sd[f"{name}.weight"].T + sd[f"{name}.bias"]

    x = sd["transformer.wte.weight"][ids] + sd["transformer.wpe.weight"][:T]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    out = []
    for layer in range(CONFIG.n_layer):
        p = f"transformer.h.{layer}"
        q, k, v = linear(ln(x, f"{p}.ln_1"), f"{p}.attn.c_attn").split(C, dim=1)
        q, k, v = (t.view(T, nh, hs).transpose(0, 1) for t in (q, k, v))
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(hs)).masked_fill(~causal, float("-inf")).softmax(-1)
        x = x + linear((att @ v).transpose(0, 1).reshape(T, C), f"{p}.attn.c_proj")
        x = x + linear(F.gelu(linear(ln(x, f"{p}.ln_2"), f"{p}.mlp.c_fc")), f"{p}.mlp.c_proj")
        if add is not None and add[0] == layer:
            x = x + add[1]
        if change is not None:
            x = change(layer, x)
        out.append(x)
    out.append(ln(x, "transformer.ln_f") @ sd["transformer.wte.weight"].T)
    return out


def steered_greedy(model, prompt: list[int], n: int, layer: int, vector: torch.Tensor) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        logits = by_hand(model, ids, (layer, vector))[-1][-1]
        logits[256:] = float("-inf")  # the app's model never samples a special (NO_SPECIALS)
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]


def direction(client, **body):
    return client.post("/chat/directions.json", json={"model": "glassbox", **body})


def steered_version(client, cid: str, mid: int, name: str, alpha: float) -> int:
    """Reply `mid` written again with α · the direction `name` (steer.json), read to its end -> its id."""
    sent = client.post(f"/chat/c/{cid}/m/{mid}/steer.json", json={"steer": [{"direction": name, "alpha": alpha}]})
    assert sent.status_code == 200, sent.get_json()
    finish(client, cid, sent.get_json()["message_id"])
    return int(sent.get_json()["message_id"])


def test_a_contrastive_direction_is_the_mean_difference_at_the_prompts_last_positions(chat_app):
    client = chat_app.test_client()
    made = direction(client, name="hi-vs-bye", layer=0, positive=["Hello there", "Hi"], negative=["Goodbye"])
    assert made.status_code == 201, made.get_json()
    got = made.get_json()
    loaded = glassbox(chat_app).core.models["chat"]
    ids = {p: loaded.prompt.build([{"role": "user", "content": p}], 1) for p in ("Hello there", "Hi", "Goodbye")}
    after = {p: by_hand(gpt(chat_app), i)[0][-1] for p, i in ids.items()}  # after block 0, last position
    want = (after["Hello there"] + after["Hi"]) / 2 - after["Goodbye"]
    assert got["layer"] == 0 and got["name"] == "hi-vs-bye" and got["model"] == "glassbox"
    torch.testing.assert_close(torch.tensor(got["vector"]), want, atol=1e-4, rtol=1e-4)
    assert got["norm"] == pytest.approx(float(want.norm()), rel=1e-4)
    listed = client.get("/chat/directions.json?model=glassbox").get_json()
    assert [d["name"] for d in listed["directions"]] == ["hi-vs-bye"] and "vector" not in listed["directions"][0]
    page = client.get("/chat/directions").get_data(as_text=True)
    assert "hi-vs-bye" in page and "Goodbye" in page


def test_a_steered_version_is_the_greedy_reply_of_a_loop_that_adds_alpha_v_after_block_L(chat_app):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=8)
    vector = torch.randn(CONFIG.n_embd, generator=torch.Generator().manual_seed(3))
    assert direction(client, name="push", layer=0, vector=vector.tolist()).status_code == 201
    sent = client.post(f"/chat/c/{cid}/m/{mid}/steer.json", json={"steer": [{"direction": "push", "alpha": 6}]})
    assert sent.status_code == 200, sent.get_json()
    steered = sent.get_json()["message_id"]
    finish(client, cid, steered)
    prompt = prompt_of(chat_app, mid)
    assert prompt_of(chat_app, steered) == prompt
    want = steered_greedy(gpt(chat_app), prompt, 8, 0, 6 * vector)
    assert tokens_of(chat_app, steered) == want
    assert tokens_of(chat_app, mid) != want  # the push changed the reply (else the test shows nothing)
    exported = json.loads(client.get(f"/chat/c/{cid}/export.json").get_data(as_text=True))
    record = next(m for m in exported["messages"] if m["id"] == steered)["intervention"]
    assert record == {"kind": "steer", "directions": [{"direction": "push", "layer": 0, "alpha": 6.0,
                                                       "norm": pytest.approx(float(vector.norm()), rel=1e-5)}]}
    page = client.get(f"/chat/c/{cid}").get_data(as_text=True)
    assert "steered: push ×6 after block 0" in page


def test_a_steered_run_never_leaves_its_keys_for_a_plain_one(chat_app):
    """The prefix cache keeps no steered run's keys (nothing taken, nothing kept), and the plain reply written
    again after a steered one is the plain reply, token for token."""
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=6)
    before = tokens_of(chat_app, mid)
    holder = glassbox(chat_app).core.models["chat"].prefix_cache
    kept = [(entry.cache, list(entry.ids)) for entry in holder._entries]
    vector = torch.randn(CONFIG.n_embd, generator=torch.Generator().manual_seed(5))  # (a constant one ln_f removes)
    assert direction(client, name="push", layer=1, vector=vector.tolist()).status_code == 201
    steered = steered_version(client, cid, mid, "push", 4)
    assert tokens_of(chat_app, steered) != before
    assert [(entry.cache, list(entry.ids)) for entry in holder._entries] == kept
    assert all(entry.variant is None for entry in holder._entries)
    csrf = csrf_of(client, f"/chat/c/{cid}")
    again = client.post(f"/chat/c/{cid}/regenerate", data={"csrf_token": csrf, "temperature": "0",
                                                           "max_new_tokens": "6"})
    assert again.status_code == 303
    plain = max(m.id for m in store_messages(chat_app, cid))
    finish(client, cid, plain)
    assert plain not in (mid, steered) and tokens_of(chat_app, plain) == before


def store_messages(app, cid: str) -> list[dict]:
    from webapp.chat.web.blueprint import service
    with app.app_context():
        return service().store.all_messages(cid)


def test_a_direction_exports_as_a_llama_cpp_control_vector_and_imports_back(chat_app, tmp_path):
    client = chat_app.test_client()
    vector = [float(i) / 7 for i in range(CONFIG.n_embd)]
    assert direction(client, name="ramp", layer=1, vector=vector).status_code == 201
    got = client.get("/chat/directions/glassbox/ramp.gguf")
    assert got.status_code == 200
    path = tmp_path / "ramp.gguf"
    path.write_bytes(got.data)
    found = read_control_vector(path)
    assert list(found) == [1] and np.allclose(found[1], np.array(vector, dtype=np.float32))
    import gguf
    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "controlvector"
    # back in, through the Directions page's form
    csrf = csrf_of(client, "/chat/directions")
    sent = client.post("/chat/directions", data={"csrf_token": csrf, "model": "glassbox", "name": "ramp2", "layer": "",
                                                 "file": (path.open("rb"), "ramp.gguf")},
                       content_type="multipart/form-data")
    assert sent.status_code == 302 and "error" not in sent.headers["Location"]
    back = client.get("/chat/directions/glassbox/ramp2.json").get_json()
    assert back["layer"] == 1 and np.allclose(back["vector"], vector)
    # after block 0 there is no llama.cpp slot: said, not written
    assert direction(client, name="first", layer=0, vector=vector).status_code == 201
    refused = client.get("/chat/directions/glassbox/first.gguf")
    assert refused.status_code == 409 and b"block 0" in refused.data


@pytest.mark.parametrize("body, status, words", [
    ({"name": "w", "layer": 0, "vector": [1.0] * 5}, 400, "list of 32 numbers"),
    ({"name": "w", "layer": 2, "vector": [1.0] * 32}, 400, "0 to 1"),
    ({"name": "w", "layer": 0, "vector": [1.0] * 31 + [float("nan")]}, 400, "finite"),
    ({"name": "w w", "layer": 0, "vector": [1.0] * 32}, 400, "name must be"),
    ({"name": "w", "layer": 0, "positive": [], "negative": ["x"]}, 400, "positive must be"),
    ({"name": "w", "layer": 0, "positive": ["x"], "negative": "x"}, 400, "negative must be"),
    ({"model": "other", "name": "w", "layer": 0, "vector": [1.0] * 32}, 400, "model must be one of"),
])
def test_a_bad_direction_is_a_400_naming_what_is_wrong(chat_app, body, status, words):
    got = chat_app.test_client().post("/chat/directions.json", json={"model": "glassbox", **body})
    assert got.status_code == status and words in got.get_json()["error"], got.get_json()


def test_a_bad_steer_request_is_a_4xx_naming_what_is_wrong(chat_app):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=3)
    assert direction(client, name="d", layer=0, vector=[0.5] * CONFIG.n_embd).status_code == 201
    assert direction(client, name="d", layer=1, vector=[0.5] * CONFIG.n_embd).status_code == 409  # name taken
    url = f"/chat/c/{cid}/m/{mid}/steer.json"
    for steer, status, words in [
        ([{"direction": "d", "alpha": 1e4}], 400, "alpha must be a finite number"),
        ([{"direction": "d", "alpha": "x"}], 400, "alpha must be"),
        ([{"direction": "nope", "alpha": 1}], 404, "No direction named"),
        ([{"direction": "d", "alpha": 1}] * 9, 400, "At most 8"),
        ("d", 400, "steer must be a list"),
    ]:
        got = client.post(url, json={"steer": steer})
        assert got.status_code == status and words in got.get_json()["error"], (steer, got.get_json())
    question = mid - 1
    assert client.post(f"/chat/c/{cid}/m/{question}/steer.json",
                       json={"steer": [{"direction": "d", "alpha": 1}]}).status_code == 404


def test_v1_steers_a_completion_with_the_glassbox_field_and_is_unchanged_without_it(chat_app):
    client = chat_app.test_client()
    vector = torch.randn(CONFIG.n_embd, generator=torch.Generator().manual_seed(7))
    assert direction(client, name="api", layer=0, vector=vector.tolist()).status_code == 201
    body = {"model": "glassbox", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 6,
            "temperature": 0, "logprobs": True}
    plain = client.post("/v1/chat/completions", json=body).get_json()
    steered = client.post("/v1/chat/completions",
                          json={**body, "glassbox": {"steer": [{"direction": "api", "alpha": 5}]}}).get_json()
    loaded = glassbox(chat_app).core.models["chat"]
    prompt = loaded.prompt.build([{"role": "user", "content": "Hello there"}], 6)
    want = steered_greedy(gpt(chat_app), prompt, 6, 0, 5 * vector)
    written = b"".join(bytes(t["bytes"]) for t in steered["choices"][0]["logprobs"]["content"])
    assert written == bytes(want)  # a byte-level model: each token one byte
    assert plain["choices"][0]["message"]["content"] != steered["choices"][0]["message"]["content"]
    again = client.post("/v1/chat/completions", json=body).get_json()
    assert again["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    bad = client.post("/v1/chat/completions", json={**body, "glassbox": {"steer": [{"direction": "api",
                                                                                    "alpha": float("inf")}]}})
    assert bad.status_code == 400
    missing = client.post("/v1/chat/completions", json={**body, "glassbox": {"steer": [{"direction": "x",
                                                                                        "alpha": 1}]}})
    assert missing.status_code == 404 and missing.get_json()["error"]["param"] == "glassbox.steer"


def test_the_lens_of_a_steered_version_reads_the_steered_model_and_says_so(chat_app):
    """Its last row is the version's own odds (the steered model's), each layer the hand-written forward with
    the vector added; the page says it reads the directions added. A direction deleted since: a clear 409."""
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=6)
    vector = torch.randn(CONFIG.n_embd, generator=torch.Generator().manual_seed(11))
    assert direction(client, name="lensed", layer=0, vector=vector.tolist()).status_code == 201
    new = steered_version(client, cid, mid, "lensed", 3)
    data = client.get(f"/chat/c/{cid}/m/{new}/lens.json").get_json()
    assert data["intervention"]["kind"] == "steer"
    prompt, reply = prompt_of(chat_app, new), tokens_of(chat_app, new)
    with chat_app.app_context():
        from webapp.chat.web.blueprint import service
        odds = service().details(new).odds
    assert [w["p"] for w in data["rows"][-1]["written"]] == pytest.approx([row[1] for row in odds], rel=1e-3)
    streams = by_hand(gpt(chat_app), prompt + reply[:-1], (0, 3 * vector))
    first = len(prompt) - 1
    logits = streams[-1]
    logits[:, 256:] = float("-inf")  # the app's model never samples a special (NO_SPECIALS)
    want = logits.softmax(-1)[first:].gather(1, torch.tensor(reply)[:, None])[:, 0]  # the model's output
    assert [w["p"] for w in data["rows"][-1]["written"]] == pytest.approx(want.tolist(), rel=1e-3)
    page = client.get(f"/chat/c/{cid}/m/{new}/lens").get_data(as_text=True)
    assert "read with the same directions added" in page and "steered: lensed ×3 after block 0" in page
    csrf = csrf_of(client, "/chat/directions")
    client.post("/chat/directions/glassbox/lensed/delete", data={"csrf_token": csrf})
    gone = client.get(f"/chat/c/{cid}/m/{new}/lens.json")
    # the kept report answers as before; a fresh server (or a forgotten report) says why it cannot
    assert gone.status_code in (200, 409)


def test_inside_and_who_pushed_a_steered_version_read_the_steered_model(chat_app):
    """Inside's last row is the steered version's own odds (the token panel's), and the attributed logit is
    the steered model's, as the hand-written forward with the vector added gives it; the page says so."""
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=5)
    vector = torch.randn(CONFIG.n_embd, generator=torch.Generator().manual_seed(13))
    assert direction(client, name="inside", layer=0, vector=vector.tolist()).status_code == 201
    new = steered_version(client, cid, mid, "inside", 3)
    prompt, reply = prompt_of(chat_app, new), tokens_of(chat_app, new)
    with chat_app.app_context():
        from webapp.chat.web.blueprint import service
        odds = service().details(new).odds
    index = 2
    inside = client.get(f"/chat/c/{cid}/m/{new}/inside/{index}.json").get_json()
    assert inside["lens"][-1]["chosen"]["p"] == pytest.approx(odds[index][1], rel=1e-3)
    logits = by_hand(gpt(chat_app), prompt + reply[:index], (0, 3 * vector))[-1][-1]
    pushed = client.get(f"/chat/c/{cid}/m/{new}/attribution/{index}.json").get_json()
    assert pushed["logit"] == pytest.approx(float(logits[reply[index]]), rel=1e-4, abs=1e-4)
    plain = by_hand(gpt(chat_app), prompt + reply[:index])[-1][-1]
    assert abs(float(plain[reply[index]]) - pushed["logit"]) > 1e-3  # the push shows
    page = client.get(f"/chat/c/{cid}/m/{new}/inside/{index}").get_data(as_text=True)
    assert "reads the model with\n    the same directions added" in page or "the same directions added" in page


def test_a_sweep_writes_one_version_per_strength_each_the_loops_reply(chat_app):
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=5)
    vector = torch.randn(CONFIG.n_embd, generator=torch.Generator().manual_seed(17))
    assert direction(client, name="sweep", layer=1, vector=vector.tolist()).status_code == 201
    sent = client.post(f"/chat/c/{cid}/m/{mid}/steer_sweep.json", json={"direction": "sweep", "alphas": [-3, 0, 3]})
    assert sent.status_code == 200, sent.get_json()
    ids = sent.get_json()["message_ids"]
    assert len(ids) == 3 and len(set(ids)) == 3
    prompt = prompt_of(chat_app, mid)
    for new, alpha in zip(ids, (-3, 0, 3)):
        finish(client, cid, new)
        assert tokens_of(chat_app, new) == steered_greedy(gpt(chat_app), prompt, 5, 1, alpha * vector)
    assert tokens_of(chat_app, ids[1]) == tokens_of(chat_app, mid)  # α = 0: the plain reply
    for body, words in [({"direction": "sweep", "alphas": [1]}, "2 to 9 numbers"),
                        ({"direction": "sweep", "alphas": [1, float("inf")]}, "alpha must be a finite number"),
                        ({"direction": "nope", "alphas": [1, 2]}, "No direction named")]:
        got = client.post(f"/chat/c/{cid}/m/{mid}/steer_sweep.json", json=body)
        assert got.status_code in (400, 404) and words in got.get_json()["error"], got.get_json()


def test_a_vector_imports_from_npy_and_safetensors_files_and_a_bad_one_is_named(chat_app, tmp_path):
    import io

    from safetensors.torch import save as safetensors_save
    client = chat_app.test_client()
    vector = np.arange(CONFIG.n_embd, dtype=np.float32) / 10
    npy = io.BytesIO()
    np.save(npy, vector)
    csrf = csrf_of(client, "/chat/directions")

    def upload(name: str, data: bytes, layer: str = "1"):
        return client.post("/chat/directions", data={"csrf_token": csrf, "model": "glassbox", "name": name,
                                                     "layer": layer, "file": (io.BytesIO(data), name)},
                           content_type="multipart/form-data")

    assert "error" not in upload("from.npy", npy.getvalue()).headers["Location"]
    assert np.allclose(client.get("/chat/directions/glassbox/from.npy.json").get_json()["vector"], vector)
    data = safetensors_save({"direction": torch.from_numpy(vector)})
    assert "error" not in upload("st.safetensors", data).headers["Location"]
    got = client.get("/chat/directions/glassbox/st.safetensors.json").get_json()
    assert got["layer"] == 1 and got["made"]["from"] == "st.safetensors"
    wide = io.BytesIO()
    np.save(wide, np.ones((2, CONFIG.n_embd), dtype=np.float32))
    refused = upload("wide.npy", wide.getvalue())
    assert "a direction is one vector" in client.get(refused.headers["Location"]).get_data(as_text=True)
    no_block = upload("nolayer.npy", npy.getvalue(), layer="")
    assert "Say after which block" in client.get(no_block.headers["Location"]).get_data(as_text=True)
    assert client.get("/chat/directions/glassbox/nolayer.npy.json").status_code == 404  # nothing saved


def test_a_pca_direction_is_the_first_component_of_the_pairs_differences(chat_app):
    client = chat_app.test_client()
    positive, negative = ["Hello there", "Hi", "Good morning"], ["Goodbye", "Bye now", "See you"]
    made = direction(client, name="pca", layer=1, positive=positive, negative=negative, method="pca")
    assert made.status_code == 201, made.get_json()
    got = torch.tensor(made.get_json()["vector"])
    loaded = glassbox(chat_app).core.models["chat"]
    rows = {p: by_hand(gpt(chat_app), loaded.prompt.build([{"role": "user", "content": p}], 1))[1][-1]
            for p in positive + negative}
    diffs = np.stack([(rows[a] - rows[b]).numpy() for a, b in zip(positive, negative)]).astype(np.float64)
    component = np.linalg.svd(diffs - diffs.mean(0))[2][0]
    mean = diffs.mean(0)
    want = component * float(mean @ component)  # scaled to the mean difference along it, pointing its way
    assert np.allclose(got.numpy(), want, atol=1e-3)
    assert float(got @ torch.tensor(mean, dtype=torch.float32)) > 0
    assert made.get_json()["made"]["method"] == "pca"
    uneven = direction(client, name="pca2", layer=1, positive=positive, negative=negative[:2], method="pca")
    assert uneven.status_code == 400 and "pairs" in uneven.get_json()["error"]
    odd = direction(client, name="pca3", layer=1, positive=positive, negative=negative, method="median")
    assert odd.status_code == 400 and "method must be mean or pca" in odd.get_json()["error"]


def test_a_browser_keeps_a_bounded_number_of_directions(chat_app, monkeypatch):
    from webapp.chat.steering import service as steering
    monkeypatch.setattr(steering, "MAX_DIRECTIONS_PER_OWNER", 2)
    client = chat_app.test_client()
    for name in ("a", "b"):
        assert direction(client, name=name, layer=0, vector=[1.0] * CONFIG.n_embd).status_code == 201
    refused = direction(client, name="c", layer=0, vector=[1.0] * CONFIG.n_embd)
    assert refused.status_code == 429 and "delete some" in refused.get_json()["error"]
    assert client.get("/chat/directions/glassbox/c.json").status_code == 404
    other = chat_app.test_client()  # another browser has its own allowance
    assert direction(other, name="c", layer=0, vector=[1.0] * CONFIG.n_embd).status_code == 201


def test_a_broken_npy_or_safetensors_file_is_a_clear_error_and_a_sweep_fits_the_job_limit(chat_app):
    import io
    client = chat_app.test_client()
    csrf = csrf_of(client, "/chat/directions")
    for name, data in (("broken.safetensors", b"not a safetensors file"), ("empty.npy", b"")):
        got = client.post("/chat/directions", data={"csrf_token": csrf, "model": "glassbox", "name": "x", "layer": "1",
                                                    "file": (io.BytesIO(data), name)},
                          content_type="multipart/form-data")
        assert got.status_code == 302
        assert "cannot be read as" in client.get(got.headers["Location"]).get_data(as_text=True)
    cid, mid = greedy_reply(client, n=3)
    assert direction(client, name="many", layer=0, vector=[0.1] * CONFIG.n_embd).status_code == 201
    most = chat_app.config["GLASSBOX"].max_jobs_per_owner
    if most:
        too_many = client.post(f"/chat/c/{cid}/m/{mid}/steer_sweep.json",
                               json={"direction": "many", "alphas": list(range(most + 1))})
        assert too_many.status_code == 400 and f"at most {most}" in too_many.get_json()["error"]


def test_the_one_head_view_of_a_steered_version_reads_the_steered_model(chat_app):
    """Its weights are the steered run's: the last row is Inside's row for that head, which reads the steered
    model, and differs from the plain run's."""
    client = chat_app.test_client()
    cid, mid = greedy_reply(client, n=6)
    vector = torch.randn(CONFIG.n_embd, generator=torch.Generator().manual_seed(19)) * 3
    assert direction(client, name="heads", layer=0, vector=vector.tolist()).status_code == 201
    new = steered_version(client, cid, mid, "heads", 2)
    head = client.get(f"/chat/c/{cid}/m/{new}/inside/4/head/1.0.json").get_json()
    inside = client.get(f"/chat/c/{cid}/m/{new}/inside/4.json").get_json()
    assert head["weights"][-1] == pytest.approx(inside["attention"]["weights"][1][0], abs=1e-6)
    context = head["context_ids"]
    plain = by_hand(gpt(chat_app), context)  # block 1's input is the plain stream after block 0
    steered = by_hand(gpt(chat_app), context, (0, 2 * vector))
    assert not torch.allclose(plain[0], steered[0])  # the push reaches block 1's input
