"""Geometry for the two server-rendered SVG pictures; the templates only draw what this computes.

1. The table as a graph: the 26 letters on a circle, every rule as a faint arrow, the true
   path and the predicted path drawn over it, the first error marked.
2. The stop probability per loop, with the threshold and k marked.
"""

from __future__ import annotations

import math

from webapp.loops.task import SYMBOLS

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


def graph(request: dict, rows: list[dict], first_error: int | None) -> dict:
    mapping = dict(tuple(p) for p in request["mapping"])
    start, steps = request["start"], request["steps"]
    true_path, current = [start], start
    for _ in range(steps):
        current = mapping[current]
        true_path.append(current)
    predicted = [start] + [row["prediction"] for row in rows]
    true_edges = set(zip(true_path, true_path[1:]))
    predicted_edges = set(zip(predicted, predicted[1:]))
    error_symbol = rows[first_error - 1]["prediction"] if first_error else None
    edges = [_edge(src, dst, "rule") for src, dst in mapping.items()
             if (src, dst) not in true_edges | predicted_edges]
    edges += [_edge(src, dst, "true") for src, dst in sorted(true_edges)]
    edges += [_edge(src, dst, "predicted") for src, dst in sorted(predicted_edges - true_edges)]
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
        nodes.append({"symbol": symbol, "x": round(x, 1), "y": round(y, 1), "classes": " ".join(classes)})
    return {"size": SIZE, "node_radius": NODE, "nodes": nodes, "edges": edges,
            "error_symbol": error_symbol, "first_error": first_error}


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
