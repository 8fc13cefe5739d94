"""A sweep's pictures as numbers for the SVG templates (templates/loops/_sweep_charts.html): accuracy
against k for the four measures with their 95% (Wilson) intervals, the stop histogram (stop loop − k)
and the histogram of the first wrong loop."""

from __future__ import annotations

import math
from collections import Counter

from webapp.loops.states import NEAR_K, near_k_label
from webapp.loops.sweep import MEASURES, stop_kind, wilson

WIDTH, HEIGHT = 440, 220
LEFT, RIGHT, TOP, BOTTOM = 44, 12, 14, 40
MEASURE_LABELS = {"answer_correct": "answer correct", "complete_trajectory": "whole trajectory",
                  "exact_stop": "exact stop", "joint_success": "joint success"}
OFFSET_LIMIT = 10  # stop offsets beyond ±10 share the end bars
MAX_BARS = 32


def interval(line: dict, measure: str) -> tuple[int, float, float]:
    """(successes, low, high) of one measure on one k line."""
    hits = round(line[measure] * line["n"])
    low, high = wilson(hits, line["n"])
    return hits, low, high


def log_axis(ks: list[int]) -> bool:
    """Whether the sweep's k grow by factors (1, 2, 4, 8, ... 256): then k goes on a log₂ axis, where on a linear
    one the small k crowd into the first few pixels."""
    ks = sorted(set(ks))
    return len(ks) >= 3 and ks[-1] >= 8 * ks[0] and all(b >= 1.5 * a for a, b in zip(ks, ks[1:]))


def accuracy_chart(lines: list[dict], max_k: int, ks: list[int] | None = None, trained_to: int | None = None) -> dict:
    """One polyline per measure over the finished k (in k order), with an interval bar at each point; `ks`: every
    k the sweep asks for (its axis is log₂ when they grow by factors, so it does not change as lines finish);
    `trained_to`: the largest k the model was trained on, marked where the sweep goes past it."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    lines = sorted(lines, key=lambda line: line["k"])
    logarithmic = log_axis(ks or [line["k"] for line in lines])

    def x(k: float) -> float:
        if logarithmic:
            return round(LEFT + plot_w * math.log2(k) / max(math.log2(max_k), 1), 1)
        return round(LEFT + plot_w * (k - 1) / max(max_k - 1, 1), 1)

    def y(p: float) -> float:
        return round(TOP + plot_h * (1 - p), 1)

    series = []
    for number, measure in enumerate(MEASURES):
        points = []
        for line in lines:
            _, low, high = interval(line, measure)
            # the four measures' bars side by side, so equal values do not hide each other
            px = round(x(line["k"]) + (number - 1.5) * 2, 1)
            points.append({"x": px, "y": y(line[measure]), "low": y(low), "high": y(high), "k": line["k"],
                           "value": line[measure]})
        series.append({"measure": measure, "label": MEASURE_LABELS[measure], "index": number, "points": points,
                       "path": " ".join(f"{p['x']},{p['y']}" for p in points)})
    ticks = sorted({1, max_k, *(_powers(max_k) if logarithmic else _nice(max_k))})
    return {"width": WIDTH, "height": HEIGHT, "left": LEFT, "right": WIDTH - RIGHT, "top": TOP,
            "bottom": HEIGHT - BOTTOM, "series": series, "log": logarithmic,
            "trained_x": x(trained_to) if trained_to is not None and trained_to < max_k else None,
            "trained_to": trained_to,
            "x_ticks": [{"x": x(t), "label": t} for t in ticks],
            "y_ticks": [{"y": y(p), "label": p} for p in (0, 0.25, 0.5, 0.75, 1)]}


def _powers(max_k: int) -> list[int]:
    """The powers of two up to max_k, for a log₂ axis."""
    return [2 ** n for n in range(int(math.log2(max_k)) + 1)]


def _nice(max_k: int) -> list[int]:
    """About six ticks between 1 and max_k, at multiples of a power of two (k is often one)."""
    step = next((s for s in (1, 2, 4, 8, 16, 32, 64, 128) if s >= max_k / 6), 256)
    return list(range(step, max_k, step))


def stop_bars(lines: list[dict]) -> list[dict]:
    """Bars of stop loop − k over every finished k: each offset from −10 to +10, the ends binned, then never."""
    counts: Counter[str] = Counter()
    for line in lines:
        for offset, count in line["stop_offsets"].items():
            if offset != "never":
                value = max(-OFFSET_LIMIT, min(OFFSET_LIMIT, int(offset)))
                offset = str(value)
            counts[offset] += count
    keys = sorted((k for k in counts if k != "never"), key=int) + (["never"] if "never" in counts else [])
    bars = []
    for key in keys:
        label = key if key == "never" else f"{int(key):+d}".replace("+0", "0")
        if key not in ("never",) and abs(int(key)) == OFFSET_LIMIT:
            label = f"≤{label}" if int(key) < 0 else f"≥{label}"
        bars.append({"label": label, "count": counts[key], "kind": stop_kind(key)})
    return bars


def error_bars(lines: list[dict]) -> list[dict]:
    """Bars of the first wrong loop over every finished k, binned to at most MAX_BARS."""
    counts: Counter[int] = Counter()
    for line in lines:
        for loop, count in line["first_errors"].items():
            counts[int(loop)] += count
    if not counts:
        return []
    width = math.ceil(max(counts) / MAX_BARS)
    binned: Counter[int] = Counter()
    for loop, count in counts.items():
        binned[(loop - 1) // width] += count
    return [{"label": str(b * width + 1) if width == 1 else f"{b * width + 1}–{(b + 1) * width}",
             "count": binned[b], "kind": "error"} for b in sorted(binned)]


def histogram(bars: list[dict], x_label: str, kinds: tuple[str, ...]) -> dict:
    """kinds: what the legend names, every one of them, whether or not a bar of it is there."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    top = max((b["count"] for b in bars), default=0)
    slot = plot_w / max(len(bars), 1)
    drawn = []
    for i, bar in enumerate(bars):
        height = plot_h * bar["count"] / top if top else 0
        drawn.append({**bar, "x": round(LEFT + i * slot + slot * 0.1, 1), "width": round(slot * 0.8, 1),
                      "y": round(TOP + plot_h - height, 1), "height": round(height, 1),
                      "cx": round(LEFT + (i + 0.5) * slot, 1),
                      "show_label": len(bars) <= 12 or i % math.ceil(len(bars) / 12) == 0})
    return {"width": WIDTH, "height": HEIGHT, "left": LEFT, "right": WIDTH - RIGHT, "top": TOP,
            "bottom": HEIGHT - BOTTOM, "bars": drawn, "x_label": x_label, "max": top, "kinds": kinds}


def model_view(lines: list[dict], max_k: int, ks: list[int] | None = None, trained_to: int | None = None) -> dict:
    """Everything one model's column shows (`ks`: every k the sweep asks for; `trained_to`: its trained k)."""
    ordered = sorted(lines, key=lambda line: line["k"])
    table = [{"k": line["k"], "n": line["n"],
              "cells": [(line[m], *interval(line, m)[1:]) for m in MEASURES]} for line in ordered]
    labels = [near_k_label(offset) for offset in NEAR_K]
    near = [{"k": line["k"], "values": [line.get("stop_near_k", {}).get(label) for label in labels]}
            for line in ordered if line.get("stop_near_k")]
    return {"near_k": near, "near_k_labels": labels,
            "accuracy": accuracy_chart(ordered, max_k, ks, trained_to),
            "stops": histogram(stop_bars(ordered), "stop loop − k", ("early", "exact", "late", "never")),
            "errors": histogram(error_bars(ordered), "first wrong loop", ("error",)),
            "table": table}
