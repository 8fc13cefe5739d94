import json
import random
import re
import shutil
import sys
import types

import pytest
import torch

from webapp.loops.model.checkpoint import DEFAULT_BUNDLE, LoopBundle, LoopModelError, load_bundle, save_bundle
from webapp.loops.model.looped import LoopConfig, LoopTransformer
from webapp.loops.model.tokenizer import CharTokenizer
from webapp.loops.task import SYMBOLS, execute, preset, shuffle_rules


@pytest.fixture(scope="module")
def bundle():
    return load_bundle(str(DEFAULT_BUNDLE))


def trace(bundle, pairs, start, k):
    """Run one request exactly as the Loop-lab page does; return predictions and stop flag."""
    rows = []
    enc = bundle.tokenizer(bundle.render_prompt(pairs, start, k), add_special_tokens=False,
                           return_tensors="pt")
    with torch.inference_mode():
        out = bundle.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                           num_loops=272, completion_threshold=0.5,
                           readout_token_ids=bundle.readout_token_ids,
                           loop_callback=lambda loop, s, stop, st: rows.append(SYMBOLS[int(s[0].argmax())]))
    return rows, out.stop_logits[0, -1].sigmoid().item() >= 0.5


def test_bundled_checkpoint_loads_in_eval_mode(bundle):
    assert isinstance(bundle, LoopBundle)
    assert not bundle.model.training and bundle.model.completion_head is not None
    assert re.fullmatch(r"bundled:loops@[0-9a-f]{12}", bundle.checkpoint_id)
    assert bundle.tokenizer.decode(bundle.readout_token_ids) == SYMBOLS
    assert (DEFAULT_BUNDLE / "model.safetensors").stat().st_size < 10_000_000


@pytest.mark.parametrize("kind, seed, start, k", [
    ("function", 11, "A", 1), ("function", 12, "M", 5), ("function", 13, "Z", 20),
    ("permutation", 14, "Q", 20), ("cycle_tail", 15, "B", 5), ("cycle", 16, "K", 20),
])
def test_bundled_model_solves_small_cases_and_stops_at_k(bundle, kind, seed, start, k):
    rng = random.Random(seed)
    pairs = shuffle_rules(preset(kind, rng), rng) if seed % 2 else preset(kind, rng)
    predictions, by_head = trace(bundle, pairs, start, k)
    assert predictions == execute(dict(pairs), start, k)
    assert by_head


def test_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    tok = CharTokenizer()
    model = LoopTransformer(LoopConfig(n_embd=16, n_head=1)).eval()
    checkpoint_id = save_bundle(model, tok, tmp_path / "mine", {"command": "test", "seed": 0})
    loaded = load_bundle(str(tmp_path / "mine"))
    assert loaded.checkpoint_id == checkpoint_id and checkpoint_id.startswith("bundled:mine@")
    saved = json.loads((tmp_path / "mine" / "config.json").read_text())
    assert saved["prompt_format"] == "v1" and saved["tokenizer"]["vocab"] == list(tok.vocab)
    ids = tok(loaded.render_prompt(preset("identity", random.Random(0)), "A", 3))["input_ids"]
    with torch.inference_mode():
        a = model(input_ids=ids, num_loops=3, completion_threshold=1.01)
        b = loaded.model(input_ids=ids, num_loops=3, completion_threshold=1.01)
    torch.testing.assert_close(a.scores, b.scores)


@pytest.fixture()
def copy_of_bundle(tmp_path):
    return shutil.copytree(DEFAULT_BUNDLE, tmp_path / "loops")


def test_missing_files_are_named(tmp_path, copy_of_bundle):
    with pytest.raises(LoopModelError, match="nowhere.*does not exist"):
        load_bundle(str(tmp_path / "nowhere"))
    (copy_of_bundle / "model.safetensors").unlink()
    with pytest.raises(LoopModelError, match=r"model\.safetensors is missing"):
        load_bundle(str(copy_of_bundle))


def test_bad_config_is_named(copy_of_bundle):
    config = copy_of_bundle / "config.json"
    config.write_text("{not json")
    with pytest.raises(LoopModelError, match=r"config\.json is invalid"):
        load_bundle(str(copy_of_bundle))


def test_shape_mismatch_names_the_weights(copy_of_bundle):
    config = copy_of_bundle / "config.json"
    saved = json.loads(config.read_text())
    saved["model"]["n_embd"] = 32
    config.write_text(json.dumps(saved))
    with pytest.raises(LoopModelError, match=r"model\.safetensors do not fit the config"):
        load_bundle(str(copy_of_bundle))


def test_factory_errors_name_the_spec(monkeypatch):
    with pytest.raises(LoopModelError, match="no_such_module:load.*not importable"):
        load_bundle("no_such_module:load")
    fake = types.ModuleType("fake_owner_model")
    fake.partial = lambda: {"model": object(), "tokenizer": None}
    fake.broken = lambda: 1 / 0
    monkeypatch.setitem(sys.modules, "fake_owner_model", fake)
    with pytest.raises(LoopModelError, match="fake_owner_model:partial.*returned no tokenizer"):
        load_bundle("fake_owner_model:partial")
    with pytest.raises(LoopModelError, match="fake_owner_model:broken.*failed"):
        load_bundle("fake_owner_model:broken")
    with pytest.raises(LoopModelError, match="fake_owner_model:absent.*not importable"):
        load_bundle("fake_owner_model:absent")


def test_example_owner_factory_loads_and_runs():
    bundle = load_bundle("examples.owner_loop_model:load")
    assert isinstance(bundle, LoopBundle) and not bundle.model.training
    assert bundle.checkpoint_id.startswith("owner-example:loops@")
    pairs = preset("function", random.Random(21))
    predictions, by_head = trace(bundle, pairs, "D", 5)
    assert predictions == execute(dict(pairs), "D", 5) and by_head
