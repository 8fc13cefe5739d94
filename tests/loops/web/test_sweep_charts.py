"""A sweep's accuracy chart: k on a log₂ axis when the sweep's k grow by factors (1, 2, 4, 8 crowded the left of a
linear one: issue 51), linear otherwise."""

from __future__ import annotations

import pytest

from webapp.loops.web.sweep_charts import accuracy_chart, log_axis


def line(k: int) -> dict:
    return {"k": k, "n": 10, "answer_correct": 0.5, "complete_trajectory": 0.5, "exact_stop": 0.5,
            "joint_success": 0.5}


@pytest.mark.parametrize("ks, log", [([1, 2, 4, 8, 16, 32, 64, 128, 256], True), ([1, 2, 4, 8], True),
                                     ([1, 2, 3, 4, 5, 6], False), ([1, 9, 17, 25], False), ([8, 16], False),
                                     (list(range(1, 257, 8)), False)])
def test_k_that_grow_by_factors_go_on_a_log_axis(ks, log):
    assert log_axis(ks) is log


def test_on_the_log_axis_doubling_k_moves_as_far_each_time_and_the_ticks_are_powers_of_two():
    ks = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    chart = accuracy_chart([line(k) for k in ks], 256, ks)
    xs = {t["label"]: t["x"] for t in chart["x_ticks"]}
    assert chart["log"] and sorted(xs) == ks
    steps = [round(xs[b] - xs[a], 1) for a, b in zip(ks, ks[1:])]
    assert max(steps) - min(steps) <= 0.2, steps  # evenly spaced
    assert xs[1] == chart["left"] and xs[256] == chart["right"]
    linear = accuracy_chart([line(k) for k in (1, 2, 3, 4)], 4, [1, 2, 3, 4])
    assert not linear["log"] and [t["label"] for t in linear["x_ticks"]] == [1, 2, 3, 4]


def test_the_axis_is_decided_by_the_sweeps_ks_not_by_the_lines_finished_so_far():
    ks = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    early = accuracy_chart([line(1), line(2)], 256, ks)  # two lines in: still the sweep's log axis
    assert early["log"]
