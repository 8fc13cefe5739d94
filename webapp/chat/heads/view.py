"""One head's attention over a reply (webapp/chat/heads/jobs.py's report) as the page and the JSON show it:
query rows × key columns labelled with the real token texts, the prompt's regions marked on both axes, and
long regions (the few-shot examples, earlier turns) summed into one column unless every position is asked
for. Shades are the Inside strips' classes (`att a0..a9`, square-root scale: attention_shade)."""

from __future__ import annotations

from dataclasses import dataclass, field

from webapp.chat.heads.jobs import HeadReport
from webapp.chat.heads.service import MAX_ROWS, ROWS, Region
from webapp.chat.inside.view import attention_shade
from webapp.chat.web.token_views import Named, token_text
from webapp.digits import plain_digits

LABELS = {"start": "start", "fewshot": "few-shot examples", "earlier": "earlier turns",
          "user": "the user's message", "reply": "the reply", "prompt": "the prompt"}
SUMMED = ("fewshot", "earlier")  # regions shown as one summed column unless every position is asked for
SPOKEN = 0.01  # a cell with at least this weight carries its percentage as text (screen readers)


class BadHead(ValueError):
    """/head/<L.H> that is not "layer.head" in numbers, or ?rows= that is not one of ROWS."""


def parse_rows(value: str | None) -> str:
    """?rows= -> where the query rows start ("reply" when absent). Raises BadHead."""
    if value is None:
        return "reply"
    if value not in ROWS:
        raise BadHead(f"rows must be one of {', '.join(ROWS)} (where the query rows start), not {value!r}.")
    return value


def parse_head(value: str) -> tuple[int, int]:
    """"L.H" (layer L, head H, both from 0) -> (L, H). Raises BadHead (not two numbers)."""
    layer, dot, head = value.partition(".")
    if not dot or not plain_digits(layer) or not plain_digits(head):
        raise BadHead(f"A head is named layer.head, e.g. 1.0 (layer 1, head 0, both from 0), not {value!r}.")
    return int(layer), int(head)


@dataclass
class Column(Named):
    region: str
    start: int  # the positions start..end-1 it shows (more than one: summed)
    end: int
    text: str  # the token's text, or for a summed column what it sums
    edge: bool  # the first column of its region

    @property
    def summed(self) -> bool:
        return self.end - self.start > 1


@dataclass
class Cell:
    weight: float
    shade: int  # attention_shade(weight); -1: a key after the query (causal: never read)
    spoken: str  # the weight as text when at least SPOKEN, else ""
    edge: bool = False  # in its region's first column


@dataclass
class Row(Named):
    position: int
    token: int
    text: str
    region: str
    this: bool  # the position that produced the token the page is about
    cells: list[Cell] = field(default_factory=list)


@dataclass
class Band:
    """A region on one axis: its label and how many columns (or rows) it spans."""

    kind: str
    label: str
    span: int
    collapsed: bool = False
    tokens: int = 0


@dataclass
class Matrix:
    columns: list[Column]
    bands: list[Band]  # across the top, left to right
    rows: list[Row]
    row_bands: list[Band]  # down the side, top to bottom (rows of one region are adjacent)
    collapsed: list[Band]  # the regions summed into one column


def matrix(tokenizer, report: HeadReport, regions: list[Region], expand: bool = False) -> Matrix:
    """The page's matrix: columns per position, the SUMMED regions one column each unless `expand`."""
    ids = report.request.context_ids
    columns: list[Column] = []
    bands: list[Band] = []
    collapsed: list[Band] = []
    for region in regions:
        label = LABELS[region.kind]
        tokens = region.end - region.start
        if region.kind in SUMMED and tokens > 1 and not expand:
            band = Band(region.kind, label, 1, True, tokens)
            bands.append(band)
            collapsed.append(band)
            columns.append(Column(region.kind, region.start, region.end, f"{label} ({tokens} tokens, summed)", True))
            continue
        bands.append(Band(region.kind, label, tokens, False, tokens))
        columns += [Column(region.kind, p, p + 1, token_text(tokenizer, ids[p])[0], p == region.start)
                    for p in range(region.start, region.end)]
    first = report.request.first
    rows: list[Row] = []
    for n, weights in enumerate(report.weights):
        position = first + n
        kind = next((r.kind for r in regions if r.start <= position < r.end), "reply")
        cells = [cell(sum(weights[c.start:c.end]), c.start > position, c.edge) for c in columns]
        rows.append(Row(position, ids[position], token_text(tokenizer, ids[position])[0], kind,
                        position == len(ids) - 1, cells))
    row_bands: list[Band] = []
    for row in rows:
        if row_bands and row_bands[-1].kind == row.region:
            row_bands[-1].span += 1
        else:
            row_bands.append(Band(row.region, LABELS[row.region], 1))
    return Matrix(columns, bands, rows, row_bands, collapsed)


def cell(weight: float, after: bool, edge: bool = False) -> Cell:
    if after:
        return Cell(0.0, -1, "", edge)
    return Cell(weight, attention_shade(weight), f"{weight * 100:.0f}%" if weight >= SPOKEN else "", edge)


def as_json(report: HeadReport, regions: list[Region]) -> dict:
    """The documented contract (docs/api.md, "One head over a reply")."""
    request = report.request
    p = len(request.context_ids) - 1
    return {
        "token": {"index": request.index},
        "head": {"layer": request.layer, "head": request.head},
        "context_ids": list(request.context_ids),
        "queries": list(range(request.first, p + 1)),
        "max_rows": MAX_ROWS,
        "regions": [{"kind": r.kind, "label": LABELS[r.kind], "start": r.start, "end": r.end} for r in regions],
        "weights": report.weights,
    }
