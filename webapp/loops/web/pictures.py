"""Geometry for the two server-rendered SVG pictures; the templates only draw what this computes.

1. The table as a graph: the 26 letters on a circle, every rule as a faint arrow, the true
   path and the hops the model took drawn over it (wrong ones red), the first wrong hop and
   the letter it stopped on marked.
2. The stop probability per loop, with the threshold and k marked.
"""

from __future__ import annotations

import math

from webapp.loops.task import SYMBOLS, execute
from webapp.loops.verdict import Verdict

SIZE, RADIUS, NODE = 360, 150, 12


def _position(symbol: str) -> tuple[float, float]:
    angle = 2 * math.pi * SYMBOLS.index(symbol) / 26 - math.pi / 2
    centre = SIZE / 2
    return centre + RADIUS * math.cos(angle), centre + RADIUS * math.sin(angle)


def _edge(src: str, dst: str, kind: str) -> dict:
    (x1, y1), (x2, y2) = _position(src), _position(dst)
    if src == dst:  # a self-loop: a small circle outside the node
        cx = SIZE / 2 + (RADIUS + NODE + 6) * (x1 - SIZE / 2) / RADIUS
        cy = SIZE / 2 + (RADIUS + NODE + 6) * (y1 - SIZE / 2) / RADIUS
        return {"kind": kind, "loop": True, "cx": round(cx, 1), "cy": round(cy, 1), "r": 8}
    length = math.hypot(x2 - x1, y2 - y1)
    ux, uy = (x2 - x1) / length, (y2 - y1) / length
    # stop at the circles' rims so the arrow heads stay visible
    return {"kind": kind, "loop": False, "x1": round(x1 + ux * NODE, 1), "y1": round(y1 + uy * NODE, 1),
            "x2": round(x2 - ux * (NODE + 2), 1), "y2": round(y2 - uy * (NODE + 2), 1)}


# How each hop the model took is drawn, over the table's faint rules and the true path (green):
#   wrong   breaks the table (red, solid): the first one is where the run first goes wrong
#   astray  follows the table, but from a wrong letter: the predicted path after a wrong hop (red, dashed)
#   extra   a right hop after loop k, where it should already have stopped (grey, dashed)
# A right hop up to k is the true path itself. An edge taken in several ways is drawn once, in the
# first kind of: true, wrong, astray, extra.
EDGE_ORDER = ("true", "wrong", "astray", "extra")


def hop_kinds(request: dict, rows: list[dict]) -> list[str]:
    """Per loop run: 'right' (up to k, on the true path) or one of wrong / astray / extra."""
    mapping = dict(tuple(p) for p in request["mapping"])
    steps, previous, kinds = request["steps"], request["start"], []
    for row in rows:
        if mapping[previous] != row["prediction"]:
            kinds.append("wrong")
        elif not row["correct"]:
            kinds.append("astray")
        else:
            kinds.append("right" if row["loop"] <= steps else "extra")
        previous = row["prediction"]
    return kinds


def graph(request: dict, rows: list[dict], found: Verdict) -> dict:
    """found: the run's verdict (webapp.loops.verdict) — where it first went wrong and where it stopped."""
    mapping = dict(tuple(p) for p in request["mapping"])
    start, steps = request["start"], request["steps"]
    true_path = [start] + execute(mapping, start, steps)
    taken: dict[tuple[str, str], str] = {edge: "true" for edge in zip(true_path, true_path[1:])}
    predicted = [start] + [row["prediction"] for row in rows]
    for edge, kind in zip(zip(predicted, predicted[1:]), hop_kinds(request, rows)):
        if kind == "right":  # already there: a right hop up to k is an edge of the true path
            continue
        if edge not in taken or EDGE_ORDER.index(kind) < EDGE_ORDER.index(taken[edge]):
            taken[edge] = kind
    edges = [_edge(src, dst, "rule") for src, dst in mapping.items() if (src, dst) not in taken]
    for kind in EDGE_ORDER:  # later kinds are drawn over earlier ones
        edges += [_edge(src, dst, kind) for (src, dst), k in sorted(taken.items()) if k == kind]
    error_symbol = found.wrong_hop.predicted if found.wrong_hop else None
    stopped_symbol = predicted[-1] if rows else None
    nodes = []
    for symbol in SYMBOLS:
        x, y = _position(symbol)
        classes = ["node"]
        if symbol in true_path:
            classes.append("on-true")
        if symbol == start:
            classes.append("start")
        if symbol == true_path[-1]:
            classes.append("answer")
        if symbol == error_symbol:
            classes.append("error")
        if symbol == stopped_symbol and not found.solved:
            classes.append("stopped")
        nodes.append({"symbol": symbol, "x": round(x, 1), "y": round(y, 1), "classes": " ".join(classes)})
    return {"size": SIZE, "node_radius": NODE, "nodes": nodes, "edges": edges,
            "kinds": [kind for kind in EDGE_ORDER if kind in taken.values()],
            "answer_symbol": true_path[-1], "stopped_symbol": stopped_symbol, "error_symbol": error_symbol,
            "first_error": found.wrong_hop.loop if found.wrong_hop else None}


def stop_chart(rows: list[dict], steps: int, threshold: float, width: int = 480, height: int = 200) -> dict:
    left, right, top, bottom = 36, 12, 12, 28
    loops = max(len(rows), steps, 1)
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(loop: float) -> float:
        return round(left + plot_w * (loop - 1) / max(loops - 1, 1), 1)

    def y(probability: float) -> float:
        return round(top + plot_h * (1 - probability), 1)

    points = " ".join(f"{x(r['loop'])},{y(r['stop_probability'])}" for r in rows)
    ticks = sorted({1, loops, *(t for t in (steps,) if t <= loops)})
    return {"width": width, "height": height, "left": left, "right": width - right, "top": top,
            "bottom": height - bottom, "points": points, "threshold_y": y(threshold), "threshold": threshold,
            "k_x": x(steps) if steps <= loops else None, "steps": steps,
            "x_ticks": [{"x": x(t), "label": t} for t in ticks],
            "y_ticks": [{"y": y(p), "label": p} for p in (0, 0.5, 1)],
            "last": {"x": x(rows[-1]["loop"]), "y": y(rows[-1]["stop_probability"])} if rows else None,
            # where loop N is, for the player's marker: x(N) = x0 + dx * (N - 1)
            "x_of": x, "x0": left, "dx": round(plot_w / max(loops - 1, 1), 4)}


SETTLE_NOT_AVAILABLE = "How much the state changed is not available for this model."


def settle_chart(rows: list[dict], chart: dict) -> dict:
    """Under the stop chart, on its loop axis (`chart`: stop_chart's): per loop, how much the loop block's
    state moved since the previous loop, ‖h_t − h_{t−1}‖ / ‖h_{t−1}‖ (the row's state_change; none at
    loop 1). A model converging to a fixed point shows it falling to 0; a cycle, a pattern that repeats."""
    if not rows or not any("state_change" in row for row in rows):
        return {"available": False, "reason": SETTLE_NOT_AVAILABLE}
    height, top, bottom = 120, 12, 24
    values = [(row["loop"], row.get("state_change")) for row in rows]
    drawn = [(loop, v) for loop, v in values if v is not None]
    # and, where the run's states were kept, how far each loop's state is from the last one's
    distances = [(row["loop"], row["distance_to_last"]) for row in rows if row.get("distance_to_last") is not None]
    peak = max([v for _, v in drawn + distances], default=0.0)
    scale = max(1.0, math.ceil(peak * 2) / 2)  # 0 to 1, or to the next half above the largest change

    def y(value: float) -> float:
        return round(top + (height - top - bottom) * (1 - min(value, scale) / scale), 1)

    x = chart["x_of"]
    return {"available": True, "width": chart["width"], "height": height, "left": chart["left"],
            "right": chart["right"], "top": top, "bottom": height - bottom,
            "points": " ".join(f"{x(loop)},{y(v)}" for loop, v in drawn),
            "distance_points": " ".join(f"{x(loop)},{y(v)}" for loop, v in distances),
            "dots": [{"x": x(loop), "y": y(v), "loop": loop, "value": v} for loop, v in drawn],
            "x_ticks": chart["x_ticks"], "k_x": chart["k_x"],
            "y_ticks": [{"y": y(v), "label": _label(v)} for v in (0, scale / 2, scale)],
            "last": drawn[-1][1] if drawn else None, "settled": bool(drawn) and drawn[-1][1] < 1e-3}


def _label(value: float) -> str:
    return f"{value:g}"
