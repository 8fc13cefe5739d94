"""A patching map (webapp/chat/patching/compute.py) as the page and the JSON show it: token texts, cells on a
diverging scale (CSS classes d-5..d5: the CSP allows no inline styles), the form's choices."""

from __future__ import annotations

from dataclasses import dataclass

from webapp.chat.decode.odds import TokenOdds
from webapp.chat.patching.compute import Cells, Patching, first_difference
from webapp.chat.patching.jobs import PatchingRequest
from webapp.chat.web.token_views import residual_label, token_text
from webapp.core.jobs import CANCELLED, DONE, FAILED, QUEUED, AnyJob

STEPS = 5  # shades on each side of 0: d-5 .. d5


@dataclass
class CellView:
    id: str  # "pc-r-<layer>-<position>" or "pc-h-<layer>-<head>": what a streamed fragment replaces
    shade: str  # "d-5".."d5"; "pending" before it is worked out; "na" when the metric did not move
    text: str
    title: str


@dataclass
class MapRow:
    label: str
    cells: list[CellView]


@dataclass
class Choice:
    id: int
    text: str
    probability: float | None
    selected: bool


@dataclass
class FormView:
    corrupted: str
    choices: list[Choice]
    typed: bool  # the alternative is a typed token, not one of the saved alternatives


@dataclass
class MapsView:
    chosen: str
    against: str
    clean: float | None  # None until both contexts have run
    corrupted: float | None
    first: int  # the first position where the contexts differ: the residual map starts there
    positions: list[str]  # the tokens at positions first..T-1
    residual: list[MapRow]
    heads: list[MapRow]
    status: str  # "done", "running", "queued", "stopped", "failed"
    error: str | None
    live: bool  # a job still running: the page streams its cells


def shade(value: float | None) -> str:
    if value is None:
        return "na"
    return f"d{max(-STEPS, min(STEPS, round(value * STEPS)))}"


def cell(part: str, layer: int, index: int, value: float | None, done: bool = True) -> CellView:
    kind = "residual" if part == "r" else "head"
    if not done:
        return CellView(f"pc-{part}-{layer}-{index}", "pending", "", "not worked out yet")
    if value is None:
        return CellView(f"pc-{part}-{layer}-{index}", "na", "–", f"{kind}: the two contexts give the same metric")
    return CellView(f"pc-{part}-{layer}-{index}", shade(value), f"{value:.2f}", f"{kind}: {value:.4f}")


def cell_views(cells: Cells, first: int) -> list[CellView]:
    """A batch's cells as the page shows them: residual positions from `first` on (the page leaves out the
    ones before the edit: 0 by construction)."""
    part = "r" if cells.part == "residual" else "h"
    return [cell(part, cells.layer, i, v) for i, v in zip(cells.indices, cells.values) if part == "h" or i >= first]


def form_view(tokenizer, odds: TokenOdds, last_message: str | None, corrupted: str | None,
              against: object) -> FormView:
    alternatives = [a for a in odds.alternatives if a[0] != odds.token]
    if not isinstance(against, int) and alternatives:
        against = alternatives[0][0]
    choices = [Choice(i, token_text(tokenizer, i)[0], p, i == against) for i, p, _ in alternatives]
    typed = isinstance(against, int) and against not in [c.id for c in choices]
    if typed and isinstance(against, int):
        choices.append(Choice(against, token_text(tokenizer, against)[0], None, True))
    return FormView(corrupted if corrupted is not None else (last_message or ""), choices, typed)


def maps_view(tokenizer, request: PatchingRequest, patching: Patching | None, job: AnyJob | None,
              config, left: bool = False) -> MapsView:
    """Both maps, every cell (pending ones blank), labelled with the tokens and layers; the residual map
    from the first edited position on (before it, every cell is 0: both runs read the same tokens). `left`:
    this browser stopped following a job another still runs: stopped here, whatever the job does."""
    T, L, nh = len(request.clean_ids), config.n_layer, config.n_head
    first = first_difference(request.clean_ids, request.corrupted_ids) or 0
    done = patching is not None
    residual: list[list[float | None]] = patching.residual if patching else [[None] * T for _ in range(L + 1)]
    heads: list[list[float | None]] = patching.heads if patching else [[None] * nh for _ in range(L)]
    # the job's state read once: a job ending while the page renders must not read as done with the cells
    # it published last still blank (and the page then no longer following its stream)
    state = job.state if job is not None else None
    filled = _filled(job) if job is not None and state != DONE else None

    def is_done(part: str, layer: int, index: int) -> bool:
        return done and (filled is None or (part, layer, index) in filled)

    status = "done"
    if state is not None:
        status = {DONE: "done", CANCELLED: "stopped", FAILED: "failed", QUEUED: "queued"}.get(state, "running")
    if left and status in ("queued", "running"):
        status = "stopped"
    return MapsView(
        chosen=token_text(tokenizer, request.chosen)[0], against=token_text(tokenizer, request.against)[0],
        clean=patching.clean if patching else None, corrupted=patching.corrupted if patching else None,
        first=first, positions=[token_text(tokenizer, t)[0] for t in request.clean_ids[first:]],
        residual=[MapRow(residual_label(layer),
                         [cell("r", layer, p, row[p], is_done("r", layer, p)) for p in range(first, T)])
                  for layer, row in enumerate(residual)],
        heads=[MapRow(f"block {layer}", [cell("h", layer, h, v, is_done("h", layer, h)) for h, v in enumerate(row)])
               for layer, row in enumerate(heads)],
        status=status, error=job.error if job is not None else None,
        live=job is not None and status in ("queued", "running"))


def _filled(job: AnyJob) -> set[tuple[str, int, int]]:
    """The cells a job has published so far (the others of its map are still None: pending)."""
    out: set[tuple[str, int, int]] = set()
    for event in job.events:
        if isinstance(event.data, Cells):
            part = "r" if event.data.part == "residual" else "h"
            out.update((part, event.data.layer, i) for i in event.data.indices)
    return out


def as_json(tokenizer, request: PatchingRequest, patching: Patching) -> dict:
    """The documented contract (docs/api.md, "Activation patching")."""
    return {
        "clean": patching.clean,
        "corrupted": patching.corrupted,
        "positions": [token_text(tokenizer, t)[0] for t in request.clean_ids],
        "residual": patching.residual,
        "heads": patching.heads,
    }
