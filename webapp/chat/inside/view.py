"""An Inside report (webapp/chat/inside/jobs.py) as the page and the JSON show it: token texts, shades
(CSS classes: the CSP allows no inline styles), heat strips, a chosen head's top positions."""

from __future__ import annotations

import math
from dataclasses import dataclass

from webapp.chat.inside.jobs import InsideReport
from webapp.chat.web.token_views import SHADES, Named, residual_label, shade, token_text

TOP_POSITIONS = 5


@dataclass
class LensCell(Named):
    token: int
    text: str
    probability: float
    shade: int
    chosen: bool


@dataclass
class LensRowView:
    layer: int
    label: str
    top: list[LensCell]
    chosen_probability: float
    chosen_rank: int
    shade: int


@dataclass
class HeadView:
    layer: int  # the block, from 0
    head: int  # from 0
    key: str  # "L.H", the ?head= value
    strip: list[int]  # each cell's shade: the weight of a run of neighbouring positions (attention_shade)
    top: tuple[int, float]  # the position it attends to most, and its weight
    cells: str = ""  # the strip's cells as HTML: templates/chat/_inside_cells.html, made once per kept report


@dataclass
class AttendedPosition(Named):
    position: int
    token: int
    text: str
    weight: float
    part: str  # "prompt" or "reply"


def attention_shade(weight: float) -> int:
    """A strip cell's class: square-root scaled, so a head that spreads its attention still shows."""
    return min(SHADES - 1, max(0, int(math.sqrt(max(weight, 0.0)) * SHADES)))


def lens_view(tokenizer, report: InsideReport) -> list[LensRowView]:
    chosen = report.request.token
    return [LensRowView(row.layer, residual_label(row.layer),
                        [LensCell(t, token_text(tokenizer, t)[0], p, shade(p), t == chosen) for t, p in row.top],
                        row.chosen_probability, row.chosen_rank, shade(row.chosen_probability))
            for row in report.lens]


def head_views(report: InsideReport) -> list[list[HeadView]]:
    """One strip per head, layers down, each cell shaded by the weight of its run of positions."""
    return [[HeadView(layer, head, f"{layer}.{head}", [attention_shade(w) for w in cells], strongest)
             for head, (cells, strongest) in enumerate(zip(strips, tops))]
            for layer, (strips, tops) in enumerate(zip(report.strips, report.strongest))]


def parse_head(value: str | None, n_layer: int, n_head: int) -> tuple[int, int] | None:
    """?head=L.H (block L, head H, both from 0) -> (L, H); None when absent or not one of the model's."""
    if not value:
        return None
    layer, _, head = value.partition(".")
    try:
        found = int(layer), int(head)
    except ValueError:
        return None
    return found if 0 <= found[0] < n_layer and 0 <= found[1] < n_head else None


def attended(tokenizer, report: InsideReport, layer: int, head: int, prompt_length: int) -> list[AttendedPosition]:
    """The TOP_POSITIONS positions one head (block `layer`, head `head`) gave most weight, heaviest first."""
    w = report.attention[layer, head]
    values, positions = w.topk(min(TOP_POSITIONS, w.numel()))
    ids = report.request.context_ids
    return [AttendedPosition(p, ids[p], token_text(tokenizer, ids[p])[0], v, "prompt" if p < prompt_length else "reply")
            for p, v in zip(positions.tolist(), values.tolist())]


def as_json(tokenizer, report: InsideReport) -> dict:
    """The documented contract (docs/api.md, "Inside a token")."""
    request = report.request
    n_layer, n_head, _ = report.attention.shape
    return {
        "token": {"index": request.index, "id": request.token, "text": token_text(tokenizer, request.token)[0]},
        "context_ids": list(request.context_ids),
        "lens": [{"layer": row.layer,
                  "top": [{"id": t, "text": token_text(tokenizer, t)[0], "p": p} for t, p in row.top],
                  "chosen": {"p": row.chosen_probability, "rank": row.chosen_rank}} for row in report.lens],
        "settled_layer": report.settled_layer,
        "attention": {"n_layer": n_layer, "n_head": n_head, "weights": report.attention.tolist()},
    }
