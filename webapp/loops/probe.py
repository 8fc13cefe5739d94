"""Decodability: can a linear probe read the letters of the walk from a looped model's state?

Trained on a sweep's runs (every loop's state h_t and the table's true letters x_0 … x_t), on a fixed
split: the runs of even-numbered tables train it, the odd ones test it. One probe per hop back j: it reads
x_{t−j}, the letter j hops before the current one (j = 0: the letter the loop is on, which the model's own
readout also gives). A probe is a multinomial logistic regression from [h_t, 1] to the 26 letters (fit()).
Held-out accuracy is reported per bucket of loops, as scripts/eval_loops.py buckets k.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from webapp.loops.states import principal_axes
from webapp.loops.task import SYMBOLS

HOPS_BACK = (0, 1, 2)
BUCKETS = ((1, 8), (9, 32), (33, 64), (65, 128), (129, 256))
RIDGE = 1e-3  # relative to the mean squared state entry: keeps the solve well posed, barely biases it
DECAY = 1e-4  # the logistic probe's weight decay: separable letters would otherwise grow it without end
STEPS = 100
MAX_SAMPLES = 20_000  # states a probe trains (and is tested) on, per hop back


@dataclass
class ProbeRun:
    """One run of a sweep: its states [n, C] (loop t's at t − 1) and the true letters x_0 … x_n."""

    table: int  # its table's index in the sweep's plan (even: training, odd: held out)
    states: torch.Tensor
    letters: list[str]
    k: int = 0  # the k it was asked for


def paths(runs: list[ProbeRun], per_k: int = 2) -> list[dict]:
    """The state's path of the first `per_k` runs at each k, on the first two principal components of
    every kept run's states together (so the runs share one picture): [{"k", "points": [[x, y], …]}]."""
    shown: list[ProbeRun] = []
    for run in runs:
        if sum(r.k == run.k for r in shown) < per_k:
            shown.append(run)
    if not shown:
        return []
    mean, axes = principal_axes(torch.cat([r.states for r in runs]))
    out = []
    for run in sorted(shown, key=lambda r: r.k):
        points = (run.states.double() - mean) @ axes.T                       # [n, 2]
        out.append({"k": run.k, "points": [[round(x, 4), round(y, 4)] for x, y in points.tolist()]})
    return out


def samples(runs: list[ProbeRun], back: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (states [N, C], the letter j = back hops before each [N], each one's loop [N])."""
    xs, ys, loops = [], [], []
    for run in runs:
        n = run.states.size(0)
        for t in range(max(1, back), n + 1):  # x_{t−j} exists from loop j (x_0 is the start letter)
            xs.append(run.states[t - 1])
            ys.append(SYMBOLS.index(run.letters[t - back]))
            loops.append(t)
    if not xs:
        return torch.zeros(0, 0, dtype=torch.float64), torch.zeros(0, dtype=torch.long), torch.zeros(0)
    return torch.stack(xs).double(), torch.tensor(ys), torch.tensor(loops)


def ridge(states: torch.Tensor, letters: torch.Tensor) -> torch.Tensor:
    """Ridge regression [h, 1] -> one-hot(letter): weights [C + 1, 26] (where the logistic fit starts)."""
    x = _with_bias(states)
    y = torch.nn.functional.one_hot(letters, len(SYMBOLS)).to(states.dtype)
    scale = float(x.pow(2).mean()) * RIDGE * x.size(0)
    return torch.linalg.solve(x.T @ x + scale * torch.eye(x.size(1), dtype=x.dtype), x.T @ y)


def fit(states: torch.Tensor, letters: torch.Tensor) -> torch.Tensor:
    """Multinomial logistic regression [h, 1] -> letter, the usual linear probe, with a little weight decay
    (DECAY): L-BFGS from the ridge solution for at most STEPS iterations, in float64, so the same data gives
    the same probe. -> weights [C + 1, 26]."""
    x = _with_bias(states.double())
    weights = ridge(states.double(), letters).contiguous().requires_grad_(True)
    optimizer = torch.optim.LBFGS([weights], max_iter=STEPS, tolerance_grad=1e-9, line_search_fn="strong_wolfe")

    def loss():
        optimizer.zero_grad()
        value = torch.nn.functional.cross_entropy(x @ weights, letters) + DECAY * weights[:-1].pow(2).sum()
        value.backward()
        return value
    with torch.enable_grad():
        optimizer.step(loss)
    return weights.detach()


def _with_bias(states: torch.Tensor) -> torch.Tensor:
    return torch.cat([states, torch.ones(states.size(0), 1, dtype=states.dtype)], 1)


def read(weights: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    return (_with_bias(states.double()) @ weights).argmax(-1)


def decodability(runs: list[ProbeRun], readout: list[tuple[int, bool]] | None = None) -> dict | None:
    """Held-out accuracy per hop back and bucket of loops: {"buckets": ["1–8", …], "rows": [{"back", "label",
    "accuracy": [fraction or None, …], "n": [held-out samples, …]}], "train": N, "test": N}; `readout`
    (loop, whether the model's own letter was right) adds its row. None: too few runs to split."""
    train = [r for r in runs if r.table % 2 == 0]
    test = [r for r in runs if r.table % 2 == 1]
    if not train or not test:
        return None
    labels = [f"{lo}–{hi}" for lo, hi in BUCKETS]
    rows = []
    if readout is not None:
        rows.append({"back": None, "label": "the model's own readout of x_t", **_by_bucket(
            torch.tensor([loop for loop, _ in readout]), torch.tensor([ok for _, ok in readout]))})
    sizes = {}
    for back in HOPS_BACK:
        x, y, loops = _thinned(*samples(train, back))
        tx, ty, tloops = _thinned(*samples(test, back))
        if not len(y) or not len(ty):
            continue
        weights = fit(x, y)
        label = "x_t, the letter it is on" if back == 0 else f"x_t−{back}, {back} hop{'s' if back > 1 else ''} back"
        rows.append({"back": back, "label": label, **_by_bucket(tloops, read(weights, tx) == ty)})
        sizes = {"train": len(y), "test": len(ty)}
    return {"buckets": labels, "rows": rows, **sizes}


def _thinned(x: torch.Tensor, y: torch.Tensor, loops: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """At most MAX_SAMPLES of them, evenly spaced (the same ones every time): the fit's cost stays bounded."""
    if len(y) <= MAX_SAMPLES:
        return x, y, loops
    keep = torch.linspace(0, len(y) - 1, MAX_SAMPLES).round().long()
    return x[keep], y[keep], loops[keep]


def _by_bucket(loops: torch.Tensor, right: torch.Tensor) -> dict:
    accuracy, counts = [], []
    for lo, hi in BUCKETS:
        inside = (loops >= lo) & (loops <= hi)
        n = int(inside.sum())
        counts.append(n)
        accuracy.append(round(float(right[inside].float().mean()), 4) if n else None)
    return {"accuracy": accuracy, "n": counts}
