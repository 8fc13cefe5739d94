"""What a run's state does (webapp/loops/states.py), each measure against a plain reference written here."""

from __future__ import annotations

import math

import pytest
import torch

from webapp.loops.states import (
    analyse,
    attention_measures,
    distance_to_last,
    pca_2d,
    settles_at,
    with_attention_measures,
)


def states(n=12, c=16, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, generator=g) + torch.linspace(0, 3, n)[:, None]  # a drift, so PC1 is clear


def test_distance_to_last_is_the_relative_norm_to_the_last_state():
    x = states()
    expected = [math.sqrt(sum((a - b) ** 2 for a, b in zip(row, x[-1].tolist())))
                / math.sqrt(sum(b * b for b in x[-1].tolist())) for row in x.tolist()]
    assert distance_to_last(x) == pytest.approx(expected, rel=1e-9)
    assert distance_to_last(x)[-1] == 0


def test_pca_is_the_projection_on_the_covariances_top_eigenvectors_with_loop_1_not_positive():
    x = states().double()
    centred = x - x.mean(0)
    values, vectors = torch.linalg.eigh(centred.T @ centred)      # ascending
    reference = centred @ vectors[:, [-1, -2]]                    # [n, 2]
    found = torch.tensor(pca_2d(x))
    for j in range(2):
        sign = -1.0 if reference[0, j] > 0 else 1.0
        assert found[:, j] == pytest.approx((sign * reference[:, j]).tolist(), abs=1e-9)
        assert found[0, j] <= 0
    # the first axis carries the most spread
    assert found[:, 0].var() > found[:, 1].var()


def test_pca_of_a_run_with_one_direction_or_one_loop():
    line = torch.tensor([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    found = pca_2d(line)
    assert [p[1] for p in found] == [0, 0, 0]  # no second direction: no noise drawn on it
    assert found[0][0] == pytest.approx(-math.sqrt(2)) and found[2][0] == pytest.approx(math.sqrt(2))
    assert pca_2d(torch.ones(1, 4)) == [[0.0, 0.0]]


def test_attention_entropy_and_shift_against_the_definitions():
    even = [[1 / 4] * 4, [1 / 4] * 4]
    sharp = [[1, 0, 0, 0], [0, 1, 0, 0]]
    rows = [{"attention": even}, {"attention": sharp}, {"attention": sharp}, {"loop": 4}]
    entropies, shifts = attention_measures(rows)
    assert entropies[0] == pytest.approx(math.log(4)) and entropies[1] == 0 and entropies[3] is None
    assert math.copysign(1, entropies[1]) == 1  # 0, never -0 (the page printed "-0")
    assert shifts[0] is None and shifts[1] == pytest.approx(0.75) and shifts[2] == 0 and shifts[3] is None


def test_settles_at_is_the_first_loop_of_the_still_tail():
    assert settles_at([None, 0.5, 0.2, 0.001, 0.0, 0.002]) == 4
    assert settles_at([None, 0.001, 0.0]) == 2
    assert settles_at([None, 0.5, 0.001, 0.3]) is None      # moved again at the end
    assert settles_at([]) is None and settles_at([None]) is None


def test_analyse_adds_each_rows_measures_and_the_runs():
    x = states(n=3, c=4)
    rows = [{"loop": i + 1, "attention": [[0.5, 0.5]]} for i in range(3)]
    found = analyse(rows, x)
    assert found == {"attention_settles_at": 2, "has_state": True}
    assert rows[-1]["distance_to_last"] == 0 and len(rows[0]["pca"]) == 2
    assert "attention_entropy" not in rows[0]  # not stored: a trace file stays small
    shown = with_attention_measures(rows)
    assert shown[0]["attention_entropy"] == pytest.approx(math.log(2), rel=1e-5) and shown[0]["attention_shift"] is None
    assert shown[1]["attention_shift"] == 0 and "attention_entropy" not in rows[1]  # copies
    bare = [{"loop": 1}]
    assert analyse(bare, None) == {"attention_settles_at": None, "has_state": False}
    assert bare == [{"loop": 1}]
