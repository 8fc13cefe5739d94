"""A sweep's pure parts: its exact-message checks, its seeded tables, and its per-k lines against the
seed's own scoring (the seed's score_trace, written out here as the owner's demo has it)."""

import math
import random

import pytest

from webapp.loops import sweep
from webapp.loops.request import RequestError
from webapp.loops.sweep import SweepSpec, disagreements, k_line, parse_k_text, plan, table, totals, wilson
from webapp.loops.task import SYMBOLS, execute

MODELS = ("main", "early")


def parse(value, max_tables=10, max_runs=100):
    return SweepSpec.parse(value, models=MODELS, max_tables=max_tables, max_runs=max_runs)


def seed_score(expected, predictions, stop_reason):
    """The seed's score_trace (shared/seeds/loop_demo_inference.py), by hand."""
    correct = bool(predictions) and predictions[-1] == expected[-1]
    exact_stop = stop_reason == "head" and len(predictions) == len(expected)
    complete = len(predictions) >= len(expected) and predictions[:len(expected)] == expected
    return {"answer_correct": correct, "complete_trajectory": complete, "exact_stop": exact_stop,
            "joint_success": correct and exact_stop}


def random_run(rng, k):
    """A made-up run at k: a random table, predictions that follow it then maybe go astray, a stop."""
    mapping = {s: rng.choice(SYMBOLS) for s in SYMBOLS}
    start = rng.choice(SYMBOLS)
    expected = execute(mapping, start, k)
    loops = max(1, k + rng.choice([-2, -1, 0, 0, 0, 1, 3]))
    truth = execute(mapping, start, loops)
    wrong = rng.choice([None, None, rng.randint(1, loops)])
    predictions = [p if wrong is None or i + 1 < wrong else SYMBOLS[(SYMBOLS.index(p) + 1) % 26]
                   for i, p in enumerate(truth)]
    reason = rng.choice(["head", "head", "head", "cap"])
    first_error = next((i + 1 for i, (p, e) in enumerate(zip(predictions[:k], expected)) if p != e), None)
    summary = {**seed_score(expected, predictions, reason), "stop_reason": reason, "executed_loops": loops,
               "first_error": first_error}
    return summary


def test_a_k_line_counts_the_seed_scoring_of_its_runs():
    rng = random.Random(3)
    for k in (1, 2, 5, 17):
        runs = [random_run(rng, k) for _ in range(40)]
        line = k_line(k, runs)
        assert line["k"] == k and line["n"] == 40
        for measure in ("answer_correct", "complete_trajectory", "exact_stop", "joint_success"):
            assert line[measure] == sum(r[measure] for r in runs) / 40
        offsets = {}
        for r in runs:
            key = "never" if r["stop_reason"] == "cap" else str(r["executed_loops"] - k)
            offsets[key] = offsets.get(key, 0) + 1
        assert line["stop_offsets"] == offsets and sum(line["stop_offsets"].values()) == 40
        errors = {}
        for r in runs:
            if r["first_error"] is not None:
                errors[str(r["first_error"])] = errors.get(str(r["first_error"]), 0) + 1
        assert line["first_errors"] == errors
        assert list(line["stop_offsets"])[-1] == "never" or "never" not in offsets  # never comes last


def test_totals_weigh_each_k_by_its_runs():
    lines = [k_line(1, [{"answer_correct": True, "complete_trajectory": True, "exact_stop": True,
                         "joint_success": True, "stop_reason": "head", "executed_loops": 1, "first_error": None}]),
             k_line(2, [{"answer_correct": False, "complete_trajectory": False, "exact_stop": False,
                         "joint_success": False, "stop_reason": "cap", "executed_loops": 272, "first_error": 1}] * 3)]
    assert totals(lines) == {"n": 4, "answer_correct": 0.25, "complete_trajectory": 0.25, "exact_stop": 0.25,
                             "joint_success": 0.25}


def test_wilson_interval_matches_the_formula_and_stays_in_0_1():
    low, high = wilson(8, 10)
    z = 1.959963984540054
    p, n = 0.8, 10
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert (low, high) == pytest.approx((centre - half, centre + half))
    assert (round(low, 3), round(high, 3)) == (0.490, 0.943)  # the textbook value
    assert wilson(0, 5)[0] == 0.0 and wilson(5, 5)[1] == pytest.approx(1.0) and wilson(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize("value, message", [
    ([], sweep.WRONG_KEYS),
    ({"family": "function", "k": [1], "tables": 1}, sweep.WRONG_KEYS),
    ({"family": "function", "k": [1], "tables": 1, "seed": 1, "extra": 1}, sweep.WRONG_KEYS),
    ({"family": "spiral", "k": [1], "tables": 1, "seed": 1}, sweep.WRONG_FAMILY),
    ({"family": "cycle", "k": [0], "tables": 1, "seed": 1}, sweep.WRONG_K),
    ({"family": "cycle", "k": [257], "tables": 1, "seed": 1}, sweep.WRONG_K),
    ({"family": "cycle", "k": [], "tables": 1, "seed": 1}, sweep.WRONG_K),
    ({"family": "cycle", "k": [True], "tables": 1, "seed": 1}, sweep.WRONG_K),
    ({"family": "cycle", "k": {"from": 5, "to": 2}, "tables": 1, "seed": 1}, sweep.WRONG_K),
    ({"family": "cycle", "k": {"from": 1, "to": 300}, "tables": 1, "seed": 1}, sweep.WRONG_K),
    ({"family": "cycle", "k": {"from": 1, "to": 3, "step": 0}, "tables": 1, "seed": 1}, sweep.WRONG_K),
    ({"family": "cycle", "k": "1-3", "tables": 1, "seed": 1}, sweep.WRONG_K),
    ({"family": "cycle", "k": [1], "tables": 0, "seed": 1}, "Tables must be an integer from 1 to 10"),
    ({"family": "cycle", "k": [1], "tables": 11, "seed": 1}, "Tables must be an integer from 1 to 10"),
    ({"family": "cycle", "k": [1], "tables": 1.0, "seed": 1}, "Tables must be an integer from 1 to 10"),
    ({"family": "cycle", "k": [1], "tables": 1, "seed": -1}, sweep.WRONG_SEED),
    ({"family": "cycle", "k": [1], "tables": 1, "seed": "1"}, sweep.WRONG_SEED),
    ({"family": "cycle", "k": [1], "tables": 1, "seed": 1, "runs": 1}, sweep.WRONG_RUNS),
    ({"family": "cycle", "k": [1], "tables": 1, "seed": 1, "model": "late"},
     "model must be one of the models offered, or a list of two of them: main, early"),
    ({"family": "cycle", "k": [1], "tables": 1, "seed": 1, "model": ["main", "main"]},
     "model must be one of the models offered, or a list of two of them: main, early"),
    ({"family": "cycle", "k": {"from": 1, "to": 11}, "tables": 10, "seed": 1},
     "A sweep may make at most 100 runs (k values × tables × models); this one asks for 110"),
])
def test_bad_sweeps_get_the_exact_message(value, message):
    with pytest.raises(RequestError) as caught:
        parse(value)
    assert caught.value.message == message


def test_a_good_sweep_parses_lists_and_ranges():
    spec = parse({"family": "cycle", "k": [8, 1, 8], "tables": 2, "seed": 5})
    assert spec.models == ("main",) and spec.ks == (1, 8) and spec.total == 4 and not spec.runs
    spec = parse({"model": ["early", "main"], "family": "identity", "k": {"from": 1, "to": 256, "step": 64},
                  "tables": 1, "seed": 0, "runs": True})
    assert spec.models == ("early", "main") and spec.ks == (1, 65, 129, 193) and spec.runs
    assert parse_k_text("1, 2,4") == [1, 2, 4] and parse_k_text("1-64") == {"from": 1, "to": 64}
    assert parse_k_text("1-256:8") == {"from": 1, "to": 256, "step": 8} and parse_k_text("a-b") == "a-b"


@pytest.mark.parametrize("family", sweep.FAMILIES)
def test_tables_depend_on_family_seed_k_and_index_only(family):
    one = plan(parse({"family": family, "k": [3, 9], "tables": 3, "seed": 11}))
    other = plan(parse({"family": family, "k": [2, 9, 40], "tables": 3, "seed": 11}))
    assert [r for k, _, r in one if k == 9] == [r for k, _, r in other if k == 9]
    assert table(family, 11, 9, 0).steps == 9
    if family != "identity":
        assert table(family, 11, 9, 0) != table(family, 12, 9, 0)


def test_disagreements_are_the_tables_where_two_models_score_differently():
    spec = parse({"model": ["main", "early"], "family": "cycle", "k": [1], "tables": 3, "seed": 1})
    good = {"answer_correct": True, "complete_trajectory": True, "exact_stop": True, "joint_success": True}
    late = {**good, "exact_stop": False, "joint_success": False}
    assert disagreements(spec, {"main": [good, good, good], "early": [good, late, None]}) == [1]
