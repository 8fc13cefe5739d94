"""The bundled early checkpoint (models/loops-early): a 100-step snapshot, made to fail both ways (wrong
hops, and stopping at the wrong loop) on purpose (docs/loop_model.md), offered beside the bundled model."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import torch

from webapp.loops.boot import EARLY_BUNDLE, extra_models
from webapp.loops.model.checkpoint import load_bundle
from webapp.loops.runs import LoopRuns
from webapp.loops.task import SYMBOLS, preset
from webapp.loops.verdict import Verdict, WrongHop, verdict

ROOT = Path(__file__).resolve().parents[2]
COMMAND = ("python scripts/train_loops.py --steps 4612 --stop-at 100 --hop-lr-scale 0.1 --seed 1"
           " --out models/loops-early")


@pytest.fixture(scope="module")
def early():
    return load_bundle(EARLY_BUNDLE)


def runs(bundle, cases: list[tuple[int, int]]) -> list[Verdict]:
    """(k, seed) -> a random-function table from `seed`, run in one batched call of the model contract,
    each cut at its own first stop (scripts/eval_loops.py checks that this equals batch-1 calls)."""
    tables = []
    for k, seed in cases:
        rng = random.Random(seed)
        tables.append((preset("function", rng), rng.choice(SYMBOLS), k))
    encs = [bundle.tokenizer(bundle.render_prompt(p, s, k), add_special_tokens=False, return_tensors="pt")
            for p, s, k in tables]
    with torch.inference_mode():
        out = bundle.model(input_ids=torch.cat([e["input_ids"] for e in encs]),
                           attention_mask=torch.cat([e["attention_mask"] for e in encs]), num_loops=272,
                           completion_threshold=0.5, readout_token_ids=list(bundle.readout_token_ids))
    found = []
    for b, (pairs, start, k) in enumerate(tables):
        fired = (out.stop_logits[b].sigmoid() >= 0.5).nonzero()
        loops = int(fired[0]) + 1 if len(fired) else 272
        predictions = [SYMBOLS[i] for i in out.scores[b, :loops].argmax(-1).tolist()]
        found.append(verdict(start, dict(pairs), k, predictions, bool(len(fired))))
    return found


def how(found: Verdict) -> str:
    return ("wrong hop, " if found.wrong_hop else "") + found.stop


def test_it_is_the_documented_reproducible_snapshot(early):
    training = json.loads((EARLY_BUNDLE / "config.json").read_text())["training"]
    assert training["command"] == COMMAND and training["steps"] == 100
    assert training["args"]["hop_lr_scale"] == 0.1 and training["args"]["steps"] == 4612
    doc = (ROOT / "docs" / "loop_model.md").read_text()
    assert early.checkpoint_id in doc and COMMAND.replace("python ", ".venv/bin/python ") in doc


def test_it_is_mostly_right_at_small_k(early):
    short = runs(early, [(k, seed) for seed, k in enumerate([1, 3, 5, 8] * 5)])
    assert sum(found.solved for found in short) >= 17
    assert all(found.stop == "exact" for found in short)  # at k <= 8 its only mistakes are hops


def test_at_long_k_it_fails_both_ways(early):
    """Not only "ran to the cap": wrong hops, and the head stopping it early or late, each on its own."""
    found = dict(zip(range(120, 140), runs(early, [(k, k) for k in range(120, 140)])))
    seen = Counter(how(v) for v in found.values())
    assert seen["wrong hop, never"] and seen["wrong hop, exact"]   # a wrong hop, then stopped right anyway
    assert seen["early"] and seen["late"] and seen["never"]          # every hop right, stopped wrong
    assert seen["exact"] and sum(seen.values()) == 20
    assert found[127].stop == "early" and found[127].loops == 7 and found[127].wrong_hop is None
    assert found[128].stop == "late" and found[128].loops == 138 and found[128].wrong_hop is None
    assert found[131].stop == "exact" and found[131].wrong_hop == WrongHop(loop=6, source="X", predicted="A", rule="O")


def test_the_bundled_model_gets_the_early_one_and_the_latent_ones_as_choices():
    main = load_bundle()
    runs = LoopRuns(main, 1, extra_models(main))
    choices = runs.choices()
    assert [c["name"] for c in choices] == ["main", "early", "latent", "latent-early"]
    assert choices[1]["checkpoint"].startswith("bundled:loops-early@")
    assert [c["carries_state"] for c in choices] == [False, False, True, True]
    assert choices[0]["trained_k"] == [1, 256] and choices[2]["trained_k"] == [1, 32]


def test_other_models_get_no_early_choice_unless_asked(monkeypatch):
    from tests.support.loop_models import bundle
    assert extra_models(bundle()) == {}
    monkeypatch.setenv("GLASSBOX_LOOP_EXTRA_MODELS", "main=x")
    with pytest.raises(ValueError):
        extra_models(bundle())
