"""What a run's state does, loop by loop: the measures the looped-transformer papers draw.

Worked out once a run has ended (the distance to the last loop and the PCA need every loop), from the
state each loop handed the callback (the loop block's output h_t, [C]) and the attention rows keep:

- distance_to_last  ‖h_t − h_last‖ / ‖h_last‖: where the state ends up, and when it got there
- pca               [x, y]: h_t on the run's own first two principal components (centred over its
                    loops; each axis's sign set so loop 1 is not on its positive side, so a rerun
                    draws the same picture)
- attention_entropy the loop block's attention over the prompt, −Σ p log p in nats, heads averaged
- attention_shift   half the L1 distance between this loop's attention and the last one's (0: it
                    looked at exactly the same places), heads averaged; none at loop 1

and per run `attention_settles_at`: the loop from which attention_shift stays under SETTLED.
state_change (‖h_t − h_{t−1}‖ / ‖h_{t−1}‖) comes from the model itself, as it runs.
"""

from __future__ import annotations

import math

import torch

SETTLED = 0.01  # attention that moves less than this (total variation) has stopped changing
NEEDS_STATE = "This needs the model's state, which this model does not hand over."
STATE_FIELDS = ("state_change", "distance_to_last", "pca")
NEAR_K = (-100, -10, -1, 0, 1)  # where a stop head that ignored a digit place would fire, and just after


def distance_to_last(states: torch.Tensor) -> list[float]:
    """states [n, C] -> per loop ‖h_t − h_n‖ / ‖h_n‖ (float64)."""
    states = states.double()
    last = states[-1]
    scale = torch.linalg.vector_norm(last).clamp_min(1e-12)
    return (torch.linalg.vector_norm(states - last, dim=-1) / scale).tolist()


def principal_axes(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """states [n, C] -> (their mean [C], their first two principal directions [2, C]), in float64; a
    direction along which they do not spread (fewer than two) is zero, not noise."""
    x = states.double()
    mean = x.mean(0)
    _, singular, vh = torch.linalg.svd(x - mean, full_matrices=False)
    axes = torch.zeros(2, x.size(1), dtype=torch.float64)
    for j in range(min(2, vh.size(0))):
        if singular[j] > 1e-9 * max(float(singular[0]), 1e-300):
            axes[j] = vh[j]
    return mean, axes


def pca_2d(states: torch.Tensor) -> list[list[float]]:
    """states [n, C] -> [n, 2]: the loops on their first two principal components (0 where a run has
    fewer directions than that), each axis's sign set so loop 1 is not on its positive side."""
    mean, axes = principal_axes(states)
    coords = (states.double() - mean) @ axes.T                     # [n, 2]
    coords = torch.where(coords[:1] > 0, -coords, coords)          # flip the axes loop 1 is positive on
    return coords.tolist()


def attention_measures(rows: list[dict]) -> tuple[list[float | None], list[float | None]]:
    """Per row (None where a row has no weights): the attention's entropy and its shift since the
    loop before."""
    entropies: list[float | None] = []
    shifts: list[float | None] = []
    previous = None
    for row in rows:
        weights = row.get("attention")
        if weights is None:
            entropies.append(None)
            shifts.append(None)
            previous = None
            continue
        p = torch.tensor(weights, dtype=torch.float64)                       # [nh, T]
        logs = torch.where(p > 0, p.clamp_min(1e-300).log(), torch.zeros_like(p))
        entropies.append(max(0.0, float(-(p * logs).sum(-1).mean())))  # a one-hot row is 0, not -0
        shifts.append(None if previous is None else float(0.5 * (p - previous).abs().sum(-1).mean()))
        previous = p
    return entropies, shifts


def settles_at(shifts: list[float | None], threshold: float = SETTLED) -> int | None:
    """The first loop from which every later shift is under the threshold (None: it never does, or
    there are no weights)."""
    if not shifts or shifts[-1] is None or shifts[-1] >= threshold:
        return None
    loop = len(shifts)
    while loop > 1 and shifts[loop - 2] is not None and shifts[loop - 2] < threshold:  # type: ignore[operator]
        loop -= 1
    return loop


def near_k_label(offset: int) -> str:
    """-1 -> "k−1", 0 -> "k", 1 -> "k+1"."""
    return "k" if offset == 0 else f"k{'+' if offset > 0 else '−'}{abs(offset)}"


def near_k(rows: list[dict], steps: int) -> list[dict]:
    """The stop probability at k−100, k−10, k−1, k and k+1: the loops where a head that ignores a digit
    place would fire early, and the one after k. Only the loops the run reached."""
    out = []
    for offset in NEAR_K:
        loop = steps + offset
        if 1 <= loop <= len(rows):
            out.append({"label": near_k_label(offset), "loop": loop, "probability": rows[loop - 1]["stop_probability"]})
    return out


def analyse(rows: list[dict], states: torch.Tensor | None) -> dict:
    """Adds each row's state measures (with `states`, [n, C] one per row); -> the run's. The attention's
    per-row measures are not stored (a trace file stays under the upload limit): with_attention_measures
    works them out from the rows' weights when they are shown."""
    _, shifts = attention_measures(rows)
    if states is not None and len(rows) == states.size(0) and rows:
        for row, distance, point in zip(rows, distance_to_last(states), pca_2d(states)):
            row["distance_to_last"] = _round(distance)
            row["pca"] = [_round(v) for v in point]
    return {"attention_settles_at": settles_at(shifts), "has_state": states is not None}


def with_attention_measures(rows: list[dict]) -> list[dict]:
    """Copies of the rows, each with weights given its attention_entropy and attention_shift."""
    entropies, shifts = attention_measures(rows)
    return [row if entropy is None else {**row, "attention_entropy": _round(entropy),
                                         "attention_shift": None if shift is None else _round(shift)}
            for row, entropy, shift in zip(rows, entropies, shifts)]


def _round(value: float) -> float:
    return float(f"{value:.6g}") if math.isfinite(value) else value
