"""A patching map (webapp/chat/patching/compute.py) as the page and the JSON show it: token texts, cells on a
diverging scale (CSS classes d-5..d5: the CSP allows no inline styles), the form's choices."""

from __future__ import annotations

from dataclasses import dataclass

from webapp.chat.decode.odds import TokenOdds
from webapp.chat.patching.compute import Cells, Patching, barely_moved, first_difference
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
    estimate: bool = False  # the first-order estimate, shown until the exact value replaces it


@dataclass
class Agreement:
    """How the estimate did against the exact cells worked out so far."""

    cells: int
    correlation: float | None  # Pearson's r (None: fewer than 2 cells, or a constant map)
    mean_error: float  # mean |exact - estimate|


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
    estimated: bool = False  # the map's estimate is known (pending cells show it)
    agreement: Agreement | None = None

    @property
    def barely_moved(self) -> bool:
        return self.clean is not None and self.corrupted is not None and barely_moved(self.clean, self.corrupted)


def shade(value: float | None) -> str:
    if value is None:
        return "na"
    return f"d{max(-STEPS, min(STEPS, round(value * STEPS)))}"


def cell(part: str, layer: int, index: int, value: float | None, done: bool = True,
         guess: float | None = None) -> CellView:
    """One cell: exact (`done`), else its estimate `guess` where there is one, else blank."""
    kind = "residual" if part == "r" else "head"
    at = f"pc-{part}-{layer}-{index}"
    if not done:
        if guess is None:
            return CellView(at, "pending", "", "not worked out yet")
        return CellView(at, shade(guess), f"≈{guess:.2f}",
                        f"{kind}: estimated {guess:.4f} (attribution patching); the exact value is to come", True)
    if value is None:
        return CellView(at, "na", "–", f"{kind}: the two contexts give the same metric")
    against = "" if guess is None else f" · estimated {guess:.4f}, off by {value - guess:+.4f}"
    return CellView(at, shade(value), f"{value:.2f}", f"{kind}: {value:.4f}{against}")


def cell_views(cells: Cells, first: int, estimate: Patching | None = None) -> list[CellView]:
    """A batch's cells as the page shows them: residual positions from `first` on (the page leaves out the
    ones before the edit: 0 by construction), each with its estimate's error where there was one."""
    part = "r" if cells.part == "residual" else "h"
    guesses = None if estimate is None else (estimate.residual if part == "r" else estimate.heads)[cells.layer]
    return [cell(part, cells.layer, i, v, guess=None if guesses is None else guesses[i])
            for i, v in zip(cells.indices, cells.values) if part == "h" or i >= first]


def estimate_views(estimate: Patching) -> list[CellView]:
    """Every cell of the map as its estimate (streamed before any exact cell)."""
    return [cell(part, layer, i, None, done=False, guess=v)
            for part, rows, start in (("r", estimate.residual, estimate.first), ("h", estimate.heads, 0))
            for layer, row in enumerate(rows) for i, v in enumerate(row) if i >= start]


def agreement(patching: Patching, filled: set[tuple[str, int, int]] | None) -> Agreement | None:
    """The estimate against the exact cells worked out (`filled`; None: every one) that needed a patched
    run (the final residual's and those before the edit are known without one, and not counted)."""
    if patching.estimate is None:
        return None
    pairs: list[tuple[float, float]] = []
    for part, exact_rows, guess_rows, start in (("r", patching.residual[:-1], patching.estimate.residual,
                                                 patching.first), ("h", patching.heads, patching.estimate.heads, 0)):
        for layer, row in enumerate(exact_rows):
            for i in range(start, len(row)):
                exact, guess = row[i], guess_rows[layer][i]
                if exact is not None and guess is not None and (filled is None or (part, layer, i) in filled):
                    pairs.append((exact, guess))
    if not pairs:
        return None
    return Agreement(len(pairs), _pearson(pairs), sum(abs(e - g) for e, g in pairs) / len(pairs))


def _pearson(pairs: list[tuple[float, float]]) -> float | None:
    n = len(pairs)
    mx, my = sum(x for x, _ in pairs) / n, sum(y for _, y in pairs) / n
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    sxx, syy = sum((x - mx) ** 2 for x, _ in pairs), sum((y - my) ** 2 for _, y in pairs)
    return None if n < 2 or sxx == 0 or syy == 0 else sxy / (sxx * syy) ** 0.5


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

    estimate = patching.estimate if patching is not None else None
    guess_residual = estimate.residual if estimate else [[None] * T for _ in range(L + 1)]
    guess_heads = estimate.heads if estimate else [[None] * nh for _ in range(L)]

    status = "done"
    if state is not None:
        status = {DONE: "done", CANCELLED: "stopped", FAILED: "failed", QUEUED: "queued"}.get(state, "running")
    if left and status in ("queued", "running"):
        status = "stopped"
    return MapsView(
        chosen=token_text(tokenizer, request.chosen)[0], against=token_text(tokenizer, request.against)[0],
        clean=patching.clean if patching else None, corrupted=patching.corrupted if patching else None,
        first=first, positions=[token_text(tokenizer, t)[0] for t in request.clean_ids[first:]],
        residual=[MapRow(residual_label(layer), [cell("r", layer, p, row[p], is_done("r", layer, p),
                                                      guess_residual[layer][p]) for p in range(first, T)])
                  for layer, row in enumerate(residual)],
        heads=[MapRow(f"block {layer}", [cell("h", layer, h, v, is_done("h", layer, h), guess_heads[layer][h])
                                         for h, v in enumerate(row)])
               for layer, row in enumerate(heads)],
        status=status, error=job.error if job is not None else None,
        live=job is not None and status in ("queued", "running"), estimated=estimate is not None,
        agreement=agreement(patching, filled) if patching is not None else None)


def _filled(job: AnyJob) -> set[tuple[str, int, int]]:
    """The cells a job has published so far (the others of its map are still None: pending)."""
    out: set[tuple[str, int, int]] = set()
    for event in job.events:
        if isinstance(event.data, Cells):
            part = "r" if event.data.part == "residual" else "h"
            out.update((part, event.data.layer, i) for i in event.data.indices)
    return out


def as_json(tokenizer, request: PatchingRequest, patching: Patching) -> dict:
    """The documented contract (docs/api.md, "Activation patching"): the exact map, or its first-order
    estimate in the same shape ("estimate": true)."""
    return {
        "estimate": patching.is_estimate,
        "clean": patching.clean,
        "corrupted": patching.corrupted,
        "positions": [token_text(tokenizer, t)[0] for t in request.clean_ids],
        "residual": patching.residual,
        "heads": patching.heads,
    }
