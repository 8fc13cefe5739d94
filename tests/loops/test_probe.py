"""Decodability probes (webapp/loops/probe.py) against a plain least-squares reference and on data whose
answer is known."""

from __future__ import annotations

import pytest
import torch

from webapp.loops.probe import DECAY, RIDGE, ProbeRun, decodability, fit, paths, read, ridge, samples
from webapp.loops.task import SYMBOLS


def letter_states(letters: list[str], noise: float, seed: int) -> torch.Tensor:
    """A state that is a fixed vector per letter plus noise: the letter is linearly readable."""
    g = torch.Generator().manual_seed(0)
    codes = torch.randn(26, 32, generator=g)
    n = torch.Generator().manual_seed(seed)
    return torch.stack([codes[SYMBOLS.index(x)] for x in letters]) + noise * torch.randn(len(letters), 32, generator=n)


def run(table: int, seed: int, n: int = 120) -> ProbeRun:
    g = torch.Generator().manual_seed(seed)
    letters = [SYMBOLS[int(i)] for i in torch.randint(0, 26, (n + 1,), generator=g)]
    return ProbeRun(table, letter_states(letters[1:], 0.1, seed), letters)  # state t holds x_t only


def test_the_start_is_the_ridge_solution_a_plain_solver_finds():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 8, generator=g, dtype=torch.float64)
    y = torch.randint(0, 26, (200,), generator=g)
    aug = torch.cat([x, torch.ones(200, 1, dtype=torch.float64)], 1)
    lam = float(aug.pow(2).mean()) * RIDGE * 200
    stacked = torch.cat([aug, lam ** 0.5 * torch.eye(9, dtype=torch.float64)])      # ridge as least squares
    target = torch.cat([torch.nn.functional.one_hot(y, 26).double(), torch.zeros(9, 26, dtype=torch.float64)])
    reference = torch.linalg.lstsq(stacked, target).solution
    assert torch.allclose(ridge(x, y), reference, atol=1e-8)


def test_the_fit_is_the_logistic_regressions_minimum():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(300, 6, generator=g, dtype=torch.float64)
    y = (x[:, :3].abs().argmax(-1) + 3 * (x[:, 0] > 0)).long()       # 6 classes, not linearly perfect
    w = fit(x, y).requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(torch.cat([x, torch.ones(300, 1, dtype=x.dtype)], 1) @ w, y) \
        + DECAY * w[:-1].pow(2).sum()
    loss.backward()
    assert w.grad.abs().max() < 1e-4  # a minimum: the gradient vanishes
    assert torch.equal(fit(x, y), fit(x, y))  # and the same data gives the same probe


def test_samples_pair_each_state_with_the_letter_j_hops_back():
    r = ProbeRun(0, torch.arange(6.0).reshape(3, 2), ["A", "B", "C", "D"])
    x, y, loops = samples([r], 1)
    assert loops.tolist() == [1, 2, 3] and [SYMBOLS[i] for i in y] == ["A", "B", "C"]
    x, y, loops = samples([r], 2)
    assert loops.tolist() == [2, 3] and [SYMBOLS[i] for i in y] == ["A", "B"] and x[0].tolist() == [2.0, 3.0]


def test_held_out_accuracy_reads_what_the_state_holds_and_not_what_it_does_not():
    runs = [run(t, seed=t) for t in range(8)]
    found = decodability(runs, readout=[(1, True), (2, False), (9, True)])
    assert found is not None and found["buckets"][0] == "1–8"
    rows = {row["back"]: row for row in found["rows"]}
    assert rows[None]["accuracy"][:2] == [0.5, 1.0]            # the model's own readout, as given
    assert rows[0]["accuracy"][0] == 1.0 and rows[0]["n"][0] == 4 * 8  # 4 held-out runs, loops 1-8
    assert rows[1]["accuracy"][1] < 0.3                         # x_{t-1} is not in these states: near chance
    assert rows[0]["accuracy"][4] is None                       # no loops past 120 here
    x, y, _ = samples(runs[1::2], 0)
    assert (read(fit(*samples(runs[::2], 0)[:2]), x) == y).float().mean() == 1.0


def test_no_split_no_probe():
    assert decodability([run(0, 1), run(2, 2)]) is None


def test_paths_share_one_pair_of_axes_and_keep_two_runs_a_k():
    runs = [ProbeRun(t, states_of(t), [], k) for t, k in enumerate((4, 4, 4, 9))]
    drawn = paths(runs)
    assert [r["k"] for r in drawn] == [4, 4, 9]
    every = torch.cat([r.states for r in runs]).double()
    centred = every - every.mean(0)
    _, vectors = torch.linalg.eigh(centred.T @ centred)
    for run, shown in zip([runs[0], runs[1], runs[3]], drawn):
        reference = (run.states.double() - every.mean(0)) @ vectors[:, [-1, -2]]
        assert torch.tensor(shown["points"]).abs() == pytest.approx(reference.abs(), abs=1e-3)  # up to each axis's sign


def states_of(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, 5, generator=g) * torch.tensor([4.0, 2.0, 1.0, 0.5, 0.1])
