"""A whole reply's logit lens (webapp/chat/lens/jobs.py) as the page and the JSON show it: a column per
reply token (who put it there, its stored odds), a row per layer, each cell the layer's most likely token,
shaded (CSS classes: the CSP allows no inline styles) by its probability or by the written token's."""

from __future__ import annotations

from dataclasses import dataclass

from webapp.chat.decode.odds import TokenOdds
from webapp.chat.inside.pages import token_origin
from webapp.chat.lens.jobs import LensReport
from webapp.chat.web.token_views import Named, residual_label, shade, token_text

SHADE_BY = ("top", "written")  # ?shade=: the cell's own token's probability, or the written token's


@dataclass
class LensColumn(Named):
    index: int  # the reply token, 0-based
    position: int  # the position that produced it
    token: int
    text: str
    origin: str  # webapp/chat/inside/pages.py token_origin: "sampled", "kept", "picked" or "typed"
    probability: float | None  # the token panel's (None: typed)
    rank: int | None


@dataclass
class LensCell(Named):
    token: int
    text: str
    probability: float
    written_probability: float
    written_rank: int
    match: bool  # the layer's most likely token is the one the reply has there
    shade: int


@dataclass
class LensGridRow:
    layer: int
    label: str
    cells: list[LensCell]


def columns(tokenizer, report: LensReport, odds_rows: list, branched_at: int | None) -> list[LensColumn]:
    first = len(report.request.prompt_ids) - 1
    found = []
    for index, token in enumerate(report.request.reply_ids):
        panel = TokenOdds.from_row(odds_rows[index])
        found.append(LensColumn(index, first + index, token, token_text(tokenizer, token)[0],
                                token_origin(panel, index, branched_at), panel.probability, panel.rank))
    return found


def grid_rows(tokenizer, report: LensReport, shade_by: str) -> list[LensGridRow]:
    """The table's rows, layers down; cells shaded by the top token's probability or the written token's."""
    texts: dict[int, str] = {}

    def text(token: int) -> str:
        if token not in texts:
            texts[token] = token_text(tokenizer, token)[0]
        return texts[token]

    written = report.request.reply_ids
    rows = []
    for layer, (top, top_p, wp, wr) in enumerate(zip(report.top, report.top_p, report.written_p,
                                                     report.written_rank)):
        cells = [LensCell(t, text(t), p, q, r, t == w, shade(q if shade_by == "written" else p))
                 for t, p, q, r, w in zip(top, top_p, wp, wr, written)]
        rows.append(LensGridRow(layer, residual_label(layer), cells))
    return rows


def as_json(tokenizer, report: LensReport, odds_rows: list, branched_at: int | None, count: int,
            intervention: dict | None) -> dict:
    """The documented contract (docs/api.md, "The logit lens over a whole reply")."""
    cols = columns(tokenizer, report, odds_rows, branched_at)
    return {
        "reply_tokens": count,
        "shown": len(cols),
        "prompt_tokens": len(report.request.prompt_ids),
        "intervention": intervention,
        "columns": [{"index": c.index, "position": c.position, "id": c.token, "text": c.text, "origin": c.origin,
                     "odds": {"p": c.probability, "rank": c.rank}} for c in cols],
        "rows": [{"layer": row.layer, "label": row.label,
                  "top": [{"id": c.token, "text": c.text, "p": c.probability} for c in row.cells],
                  "written": [{"p": c.written_probability, "rank": c.written_rank} for c in row.cells]}
                 for row in grid_rows(tokenizer, report, "top")],
    }
