"""Geometry for what a run's state does (webapp/loops/states.py's measures); the templates only draw it.

1. The trajectory: the state's path over the loops on the run's first two principal components, loop 1
   to the last, with loop k, the first wrong loop and the loop the head stopped at marked.
2. The attention's entropy per loop, on the stop chart's loop axis, and where it stops changing.
3. The stop probability near k: at k−100, k−10, k−1, k and k+1, where the run got there.
4. A sweep's runs' paths together, coloured by k.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from webapp.loops.states import NEEDS_STATE, near_k, with_attention_measures

__all__ = ["near_k", "sweep_paths", "trajectory", "attention_chart"]

SIZE, PAD = 360, 24
LEGEND_ROW = 8  # k values per row of a sweep picture's legend
MARK_LABELS = {"start": "loop 1", "k": "k", "error": "first wrong", "stop": "stopped"}


def in_square(points) -> Callable[[float, float], tuple[float, float]]:
    """The map from these [x, y] points to the SIZE square, equal scale on both axes, centred, y up."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    spread = max(max(xs) - min(xs), max(ys) - min(ys)) or 1.0
    mid_x, mid_y = (max(xs) + min(xs)) / 2, (max(ys) + min(ys)) / 2
    scale = (SIZE - 2 * PAD) / spread

    def place(x: float, y: float) -> tuple[float, float]:
        return round(SIZE / 2 + (x - mid_x) * scale, 1), round(SIZE / 2 - (y - mid_y) * scale, 1)
    return place


def trajectory(rows: list[dict], steps: int, first_error: int | None, stopped_at: int | None) -> dict:
    """rows with "pca" ([x, y] per loop) -> the path, scaled to the square with equal axes."""
    points = [(row["loop"], row["pca"], row["prediction"], row.get("correct")) for row in rows if "pca" in row]
    if not points:
        return {"available": False, "reason": NEEDS_STATE}
    place = in_square([p for _, p, _, _ in points])
    n = len(points)
    dots = []
    for i, (loop, (x, y), letter, correct) in enumerate(points):
        cx, cy = place(x, y)
        marks = [name for name, at in (("start", 1), ("k", steps), ("error", first_error), ("stop", stopped_at))
                 if at == loop]
        dots.append({"x": cx, "y": cy, "loop": loop, "letter": letter, "marks": marks,
                     "label": ", ".join(MARK_LABELS[m] for m in marks),
                     "anchor": "end" if cx > SIZE * 0.6 else "start",  # labels stay inside the square
                     "beyond": loop > steps, "wrong": correct is False,
                     # later loops darker: the eye follows the path from light to dark
                     "shade": round(0.25 + 0.75 * i / max(n - 1, 1), 3)})
    return {"available": True, "size": SIZE, "dots": dots,
            "within": " ".join(f"{d['x']},{d['y']}" for d in dots if not d["beyond"]),
            "beyond": " ".join(f"{d['x']},{d['y']}" for d in dots[max(0, steps - 1):] if d["loop"] >= steps),
            "marked": [d for d in dots if d["marks"]], "distinct": _distinct(points),
            "first_error": first_error}


def _distinct(points) -> int:
    """How many distinct places the state visits (to 3 decimals of the PCA): a state that snaps to one
    point per letter visits as many places as letters."""
    return len({(round(p[0], 3), round(p[1], 3)) for _, p, _, _ in points})


def attention_chart(rows: list[dict], chart: dict, settles_at: int | None) -> dict:
    """The attention's entropy per loop (nats), under the stop chart on its loop axis."""
    values = [(row["loop"], row["attention_entropy"]) for row in with_attention_measures(rows)
              if row.get("attention_entropy") is not None]
    if not values:
        return {"available": False}
    height, top, bottom = 110, 12, 24
    peak = max(max(v for _, v in values) * 1.1, 0.05)

    def y(value: float) -> float:
        return round(top + (height - top - bottom) * (1 - value / peak), 1)

    x = chart["x_of"]
    return {"available": True, "width": chart["width"], "height": height, "left": chart["left"],
            "right": chart["right"], "top": top, "bottom": height - bottom,
            "points": " ".join(f"{x(loop)},{y(v)}" for loop, v in values),
            "x_ticks": chart["x_ticks"], "k_x": chart["k_x"],
            "y_ticks": [{"y": y(v), "label": f"{v:.2g}"} for v in (0, peak)],
            "settles_x": x(settles_at) if settles_at else None, "settles_at": settles_at,
            "low": min(v for _, v in values), "high": max(v for _, v in values)}


def sweep_paths(paths: list[dict]) -> dict:
    """A sweep's runs' paths on shared principal components (webapp/loops/probe.py paths), coloured by k
    on a log scale (blue: the smallest k, red: the largest)."""
    points = [p for run in paths for p in run["points"]]
    if not points:
        return {"available": False}
    fit = in_square(points)
    ks = sorted({run["k"] for run in paths})

    def colour(k: int) -> str:
        share = math.log(k / ks[0]) / math.log(ks[-1] / ks[0]) if ks[-1] > ks[0] else 0.0
        return f"hsl({round(230 - 230 * share)}, 70%, 45%)"

    def place(x: float, y: float) -> str:
        px, py = fit(x, y)
        return f"{px},{py}"

    return {"available": True, "size": SIZE,
            "runs": [{"k": run["k"], "colour": colour(run["k"]), "points": " ".join(place(*p) for p in run["points"]),
                      "start": place(*run["points"][0])} for run in paths if run["points"]],
            "legend": [{"k": k, "colour": colour(k), "x": PAD + (i % LEGEND_ROW) * 42,
                        "y": SIZE + 6 + (i // LEGEND_ROW) * 16} for i, k in enumerate(ks)],
            "height": SIZE + 8 + 16 * math.ceil(len(ks) / LEGEND_ROW)}
