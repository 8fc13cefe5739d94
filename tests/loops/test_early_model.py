"""The bundled early checkpoint (models/loops-early): a 100-step snapshot of the same training run
that shows failure on purpose (docs/loop_model.md), offered beside the bundled model."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from webapp.loops.boot import EARLY_BUNDLE, extra_models
from webapp.loops.model.checkpoint import load_bundle
from webapp.loops.runs import LoopRuns
from webapp.loops.task import execute, preset

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def early():
    return load_bundle(EARLY_BUNDLE)


def joint(bundle, k: int, seed: int) -> bool:
    rng = random.Random(seed)
    pairs, start = preset("function", rng), rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    enc = bundle.tokenizer(bundle.render_prompt(pairs, start, k), add_special_tokens=False, return_tensors="pt")
    with torch.inference_mode():
        out = bundle.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], num_loops=272,
                           completion_threshold=0.5, readout_token_ids=list(bundle.readout_token_ids),
                           loop_callback=lambda *a: None)
    predictions = ["ABCDEFGHIJKLMNOPQRSTUVWXYZ"[i] for i in out.scores[0].argmax(-1).tolist()]
    return int(out.halted_at[0]) == k and predictions[k - 1] == execute(dict(pairs), start, k)[-1]


def test_it_is_the_documented_reproducible_snapshot(early):
    training = json.loads((EARLY_BUNDLE / "config.json").read_text())["training"]
    assert training["steps"] == 100 and training["args"]["stop_at"] == 100 and training["args"]["steps"] == 4612
    assert early.checkpoint_id in (ROOT / "docs" / "loop_model.md").read_text()


def test_it_is_right_at_small_k_and_makes_mistakes_at_larger_k(early):
    assert all(joint(early, k, seed) for seed, k in enumerate([1, 3, 5, 8] * 3))
    assert sum(not joint(early, 200, seed) for seed in range(12)) >= 4


def test_the_bundled_model_gets_the_early_one_as_a_choice():
    main = load_bundle()
    runs = LoopRuns(main, 1, extra_models(main))
    names = [c["name"] for c in runs.choices()]
    assert names == ["main", "early"]
    assert runs.choices()[1]["checkpoint"].startswith("bundled:loops-early@")


def test_other_models_get_no_early_choice_unless_asked(monkeypatch):
    from tests.support.loop_models import bundle
    assert extra_models(bundle()) == {}
    monkeypatch.setenv("GLASSBOX_LOOP_EXTRA_MODELS", "main=x")
    with pytest.raises(ValueError):
        extra_models(bundle())
