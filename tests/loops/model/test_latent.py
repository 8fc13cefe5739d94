"""The latent-state looped model (webapp/loops/model/latent.py): it carries its state, hands it over, trains
through its unrolled loops, loads from a bundle by its config, and the bundled one is the documented one."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from webapp.loops.boot import BESIDE_BUNDLED
from webapp.loops.model.checkpoint import LoopModelError, load_bundle, save_bundle
from webapp.loops.model.latent import LatentLoopTransformer
from webapp.loops.model.looped import LoopConfig
from webapp.loops.model.tokenizer import CharTokenizer
from webapp.loops.task import SYMBOLS, execute, preset, render_prompt

TOK = CharTokenizer()
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def random_model():
    torch.manual_seed(0)
    model = LatentLoopTransformer(replace(LoopConfig(n_embd=32), carry="latent"))
    with torch.no_grad():  # the injection starts at zero: make it matter here
        model.inject.weight.normal_(0, 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def latent():
    return load_bundle(BESIDE_BUNDLED["latent"])


def encode(k=6, seed=0, start="C"):
    return TOK(render_prompt(preset("function", random.Random(seed)), start, k),
               add_special_tokens=False, return_tensors="pt")


def by_hand(model, enc, loops):
    """The recurrence written out: s_0 = the start slot, s_t = block(s_{t-1} + W s_0) -> [loops, 26] scores
    and the states [loops, C]."""
    ids = torch.tensor(TOK.readout_token_ids)
    kv, mask, slots = model.encode(enc["input_ids"], enc["attention_mask"])
    s0 = slots[:, 0]
    s, scores, states = s0, [], []
    block = model.loop_block
    for _ in range(loops):
        x = block.ln_1((s + s0 @ model.inject.weight.t()).unsqueeze(1))
        q = block.attn.split(block.attn.q_proj(x))
        att = (q @ kv[0].transpose(-2, -1) / q.size(-1) ** 0.5).softmax(-1)
        a = block.attn.c_proj((att @ kv[1]).transpose(1, 2).reshape(1, 1, -1))
        s = (a + block.mlp(block.ln_2(a)))[:, 0]
        states.append(s[0])
        scores.append((model.ln_f(s) @ model.wte.weight[ids].t() / model.config.n_embd ** 0.5)[0])
    return torch.stack(scores), torch.stack(states)


def test_each_loop_starts_from_the_last_ones_state_not_its_letter(random_model):
    enc = encode()
    seen: list[tuple] = []
    with torch.inference_mode():
        out = random_model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], num_loops=8,
                           completion_threshold=2.0, readout_token_ids=TOK.readout_token_ids, loop_state=True,
                           loop_callback=lambda loop, s, stop, st, state: seen.append((loop, state.clone())))
        scores, states = by_hand(random_model, enc, 8)
    assert out.scores[0] == pytest.approx(scores, abs=1e-5)
    assert [loop for loop, _ in seen] == list(range(1, 9))
    assert torch.stack([s[0] for _, s in seen]) == pytest.approx(states, abs=1e-5)  # the state handed over


def test_the_training_unroll_is_the_inference_loop(random_model):
    enc = encode(seed=3)
    with torch.no_grad():
        trained = random_model.unroll(enc["input_ids"], 10, 12, attention_mask=enc["attention_mask"])
        alone = random_model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], num_loops=10,
                             completion_threshold=2.0, readout_token_ids=TOK.readout_token_ids)
    assert trained["scores"][0] == pytest.approx(alone.scores[0], abs=1e-4)
    assert trained["stop_logits"].shape == (1, 12)
    assert trained["stop_logits"][0, :10] == pytest.approx(alone.stop_logits[0], abs=1e-5)
    assert trained["rule_scores"].shape == (1, 26, 26)


def test_a_bundle_says_which_model_it_is(tmp_path, random_model):
    save_bundle(random_model, TOK, tmp_path / "m", {"trained_k": [1, 5]})
    loaded = load_bundle(tmp_path / "m")
    assert isinstance(loaded.model, LatentLoopTransformer) and loaded.trained_k == [1, 5]
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["model"]["carry"] = "thoughts"
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoopModelError, match=r"config\.json is invalid: carry is 'thoughts'"):
        load_bundle(tmp_path / "m")


def test_the_bundled_latent_model_is_the_documented_one_and_solves_its_trained_range(latent):
    training = json.loads((BESIDE_BUNDLED["latent"] / "config.json").read_text())["training"]
    assert training["trained_k"] == latent.trained_k == [1, 32]
    assert training["command"].startswith("python scripts/train_latent_loops.py")
    assert training["command"] in (ROOT / "docs" / "loop_model.md").read_text()
    assert isinstance(latent.model, LatentLoopTransformer) and latent.model.carries_state
    rng = random.Random(20_261_206)
    for _ in range(20):
        pairs, start, k = preset("function", rng), rng.choice(SYMBOLS), rng.randint(1, 32)
        enc = TOK(render_prompt(pairs, start, k), add_special_tokens=False, return_tensors="pt")
        with torch.inference_mode():
            out = latent.model(input_ids=enc["input_ids"], num_loops=272, readout_token_ids=TOK.readout_token_ids)
        assert int(out.halted_at[0]) == k
        assert [SYMBOLS[i] for i in out.scores[0].argmax(-1).tolist()] == execute(dict(pairs), start, k)


def test_the_early_latent_checkpoint_was_trained_shallower_and_errs():
    early = load_bundle(BESIDE_BUNDLED["latent-early"])
    training = json.loads((BESIDE_BUNDLED["latent-early"] / "config.json").read_text())["training"]
    assert early.trained_k == training["trained_k"] and early.trained_k[1] < 32
    assert "--stop-at" in training["command"]
    rng, wrong = random.Random(7), 0
    for _ in range(40):
        pairs, start = preset("function", rng), rng.choice(SYMBOLS)
        enc = TOK(render_prompt(pairs, start, 64), add_special_tokens=False, return_tensors="pt")
        with torch.inference_mode():
            out = early.model(input_ids=enc["input_ids"], num_loops=64, completion_threshold=2.0,
                              readout_token_ids=TOK.readout_token_ids)
        wrong += [SYMBOLS[i] for i in out.scores[0].argmax(-1).tolist()] != execute(dict(pairs), start, 64)
    assert wrong >= 1
