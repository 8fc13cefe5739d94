"""The player's "where the loop looked": one loop's attention over the prompt, as shaded characters.

Shades are CSS classes w0..w9 (the page's CSP allows no inline styles). They follow the square root
of the weight: the loop block puts nearly all its mass on one rule, and a linear scale would leave
every other character blank, hiding the small weights a room wants to see.
"""

from __future__ import annotations

import math
from typing import Any

from webapp.loops.reading import NOT_AVAILABLE
from webapp.loops.task import render_prompt

SHADES = 9


def shade(weight: float) -> int:
    return min(SHADES, round(math.sqrt(max(weight, 0.0)) * SHADES))


def strip(prompt: str, weights: list[float]) -> list[dict]:
    return [{"char": char, "shade": shade(w), "weight": w} for char, w in zip(prompt, weights)]


def attention_view(snapshot: dict, current: int | None) -> dict[str, Any]:
    """What the player shows for loop `current` (None: the last loop) of a finished trace."""
    rows = snapshot.get("trace") or []
    if not rows:
        return {"available": False, "reason": NOT_AVAILABLE}
    at = current or len(rows)
    row = rows[at - 1]
    heads = row.get("attention")
    if not heads:
        return {"available": False, "reason": NOT_AVAILABLE, "loop": at}
    request = snapshot["request"]
    prompt = render_prompt(request["mapping"], request["start"], request["steps"])
    combined = [sum(ws) / len(heads) for ws in zip(*heads)]
    return {"available": True, "loop": at, "read": row.get("read"),
            "combined": strip(prompt, combined),
            "heads": [strip(prompt, weights) for weights in heads]}
