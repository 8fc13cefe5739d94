"""Activation patching between two prompts of equal length: a clean run and a corrupted one (the same
context with the last user message edited), and how much of the metric each clean activation brings back
when copied into the corrupted run.

    metric(x)  = logit(chosen) - logit(against) at the last position, T-1
    normalised = (metric(patched) - metric(corrupted)) / (metric(clean) - metric(corrupted))

1 means that activation alone restores the clean answer; 0 that it changes nothing.

Residual cells, (n_layer + 1) x T. Layer l names the residual stream *entering* block l:

    layer 0        the embeddings, wte(ids) + wpe(positions)           (the input to block 0)
    layer l        the output of block l-1, the input to block l
    layer n_layer  the final residual, before ln_f

Cell (l, p) replaces the corrupted run's residual at layer l, position p, by the clean run's, and runs
blocks l..n_layer-1 from there. Head cells, n_layer x n_head: head h of block l (0-based, its output
before c_proj: softmax(q kᵀ/√hs) v) gets the clean run's output at every position, through
edits.HeadEdit with a (T, hs) value, as every edit of a run is made (webapp/chat/model/edits.py).

What makes it cheap, all exact (no approximation):
- positions before f, the first token where the two contexts differ, see the same tokens in both runs, so
  their activations are the same: patching one changes nothing (residual cells (l, p < f) are 0 without a
  forward), and a head's clean output differs from the corrupted one only from f on;
- a patched run changes nothing before its patched position: it runs positions s..T-1 alone (s the
  smallest patched position of its batch; f for heads), reading the corrupted run's keys and values of the
  positions before s, and from the patched layer on (the layers below are the corrupted run's);
- at the last block only the last position's output is needed (the others' keys and values are);
- the patched runs of one layer go through the model together, several cells per forward (a batch).
- the corrupted run itself runs positions f..T-1 only, on the clean run's keys and values before f;
- and the clean run too, where a finished reply's kept KV cache holds the positions before f (trace's
  `kept`: the activations there are never read).
The patched runs go the largest first when an estimate of the map is given (webapp/chat/patching/estimate.py).

Shapes: T positions, C n_embd, nh n_head, hs = C // nh, B patched runs in one forward, L n_layer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from webapp.chat.model import hooked
from webapp.chat.model.edits import Edit, HeadEdit
from webapp.chat.model.hooked import KeysValues

BATCH_TOKENS = 512  # positions run in one patched forward (rows x positions): several cells at once
# An edit that moves the metric (a logit difference) by less than this: each cell divides by it, so the runs'
# small differences look large and the map is mostly noise; the page says so.
SMALL_SPAN = 0.1


def barely_moved(clean: float, corrupted: float) -> bool:
    return clean != corrupted and abs(clean - corrupted) < SMALL_SPAN


@dataclass
class Trace:
    """One run of a context: everything a patched run takes from it."""

    residuals: Tensor  # (L + 1, T, C): the residual stream entering each block, then the final one
    heads: Tensor  # (L, nh, T, hs): each head's output before c_proj
    keys_values: KeysValues  # per layer, (1, nh, T, hs) each
    metric: float
    held_from: int = 0  # residuals and heads before it are zeros (a kept KV cache's positions, never read)


@dataclass
class Cells:
    """A batch of finished cells: part "residual" (index: a position) or "heads" (index: a head)."""

    part: str
    layer: int
    indices: list[int]
    values: list[float | None]  # normalised; None when the clean and corrupted metrics are equal


@dataclass
class Patching:
    """The whole map, as the JSON gives it."""

    clean: float
    corrupted: float
    residual: list[list[float | None]]  # (L + 1) x T
    heads: list[list[float | None]]  # L x nh
    first: int = 0  # the first position where the contexts differ
    is_estimate: bool = False  # the first-order estimate (webapp/chat/patching/estimate.py), not exact cells
    estimate: Patching | None = None  # an exact map's estimate, made before its cells

    def to_come(self) -> Patching:
        """A map of this one's shape and metrics with every cell still to come, this one its estimate."""
        return Patching(self.clean, self.corrupted, [[None] * len(row) for row in self.residual],
                        [[None] * len(row) for row in self.heads], self.first, estimate=self)

    def fill(self, cells: Cells) -> None:
        rows = self.residual if cells.part == "residual" else self.heads
        for index, value in zip(cells.indices, cells.values):
            rows[cells.layer][index] = value


@dataclass
class Plan:
    """What a patching job runs: the two traces, then batches of cells (`batches`)."""

    model: Any
    clean_ids: list[int]
    corrupted_ids: list[int]
    chosen: int
    against: int
    first: int
    clean: Trace
    corrupted: Trace
    batch_tokens: int = BATCH_TOKENS
    between: Callable[[], None] | None = None
    _device: torch.device = field(init=False)

    def __post_init__(self) -> None:
        self._device = next(self.model.parameters()).device

    @property
    def span(self) -> float:
        return self.clean.metric - self.corrupted.metric

    def normalise(self, metric: float) -> float | None:
        return None if self.span == 0 else (metric - self.corrupted.metric) / self.span

    def empty(self) -> Patching:
        c = self.model.config
        T = len(self.clean_ids)
        return Patching(self.clean.metric, self.corrupted.metric, [[None] * T for _ in range(c.n_layer + 1)],
                        [[None] * c.n_head for _ in range(c.n_layer)], self.first)

    def batches(self, first_by: Patching | None = None) -> Iterator[Cells]:
        """Every cell, a batch at a time: those known without a forward first, then the patched runs, the
        cheapest layers first, or with `first_by` (an estimate of the map) the batches holding the largest
        estimated cells first."""
        L, nh = self.model.config.n_layer, self.model.config.n_head
        T, f = len(self.clean_ids), self.first
        # the final residual reaches the metric at the last position alone: the clean one there
        final: list[float | None] = [0.0] * (T - 1)
        yield Cells("residual", L, list(range(T)), [*final, self.normalise(self.clean.metric)])
        if f > 0:  # before the first difference, both runs are the same: nothing to restore
            for layer in range(L - 1, -1, -1):
                yield Cells("residual", layer, list(range(f)), [0.0] * f)
        runs: list[tuple[str, int, list[int]]] = []  # (part, layer, indices): one patched forward each
        for layer in range(L - 1, -1, -1):
            runs += [("residual", layer, positions)
                     for positions in _chunks(list(range(f, T)), self.batch_tokens, lambda p: T - p)]
            runs += [("heads", layer, heads) for heads in _chunks(list(range(nh)), self.batch_tokens, lambda _: T - f)]
        if first_by is not None:
            runs.sort(key=lambda run: -_largest(first_by, *run))  # stable: ties keep the cheapest first
        for part, layer, indices in runs:
            metrics = self._residual(layer, indices) if part == "residual" else self._heads(layer, indices)
            yield Cells(part, layer, indices, [self.normalise(m) for m in metrics])

    def _residual(self, layer: int, positions: list[int]) -> list[float]:
        """Metric of each run with the clean residual entering block `layer` at one of `positions`."""
        s = positions[0]
        x = self.corrupted.residuals[layer, s:].expand(len(positions), -1, -1).clone()  # (B, T - s, C)
        for row, p in enumerate(positions):
            x[row, p - s] = self.clean.residuals[layer, p]
        return self._metrics(x, layer, s, None)

    def _heads(self, layer: int, heads: list[int]) -> list[float]:
        """Metric of each run with head h of block `layer` outputting the clean run's at every position."""
        f = self.first
        x = self.corrupted.residuals[layer, f:].expand(len(heads), -1, -1).clone()  # (B, T - f, C)
        edits: list[Edit | None] = [Edit(heads=(HeadEdit(layer, h, self.clean.heads[layer, h]),)) for h in heads]
        return self._metrics(x, layer, f, edits)

    def _metrics(self, x: Tensor, layer: int, start: int, edits: list[Edit | None] | None) -> list[float]:
        """x (B, T - start, C): B patched runs' streams entering block `layer` at positions start..T-1, on
        the corrupted run's keys and values before start -> each run's metric."""
        past = self.corrupted.keys_values if start > 0 else None
        out = hooked.run(self.model, x, start=start, past=past, first_layer=layer, edits=edits, last_only=True,
                         between=self.between)
        return metric(self.model, out.x[:, -1], self.chosen, self.against).tolist()


def _largest(patching: Patching, part: str, layer: int, indices: list[int]) -> float:
    """The largest |value| of some cells of a map (None, an unmoved metric, counts as 0)."""
    row = (patching.residual if part == "residual" else patching.heads)[layer]
    return max(abs(row[i] or 0.0) for i in indices)


def _chunks(items: list[int], budget: int, cost: Callable[[int], int]) -> Iterator[list[int]]:
    """items in runs whose summed cost (positions run) stays within budget (at least one item each)."""
    chunk: list[int] = []
    for item in items:
        if chunk and (len(chunk) + 1) * cost(chunk[0]) > budget:
            yield chunk
            chunk = []
        chunk.append(item)
    if chunk:
        yield chunk


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two equal-length contexts differ (None: they are the same)."""
    return next((p for p, (x, y) in enumerate(zip(a, b)) if x != y), None)


def edited_from(clean_ids: Sequence[int], corrupted_ids: Sequence[int]) -> int:
    """The first position where the two contexts differ. Raises ValueError for contexts of different
    lengths, or equal ones."""
    if len(clean_ids) != len(corrupted_ids):
        raise ValueError(f"the contexts have {len(clean_ids)} and {len(corrupted_ids)} tokens")
    first = first_difference(clean_ids, corrupted_ids)
    if first is None:
        raise ValueError("the two contexts are the same")
    return first


@torch.inference_mode()
def plan(model: Any, clean_ids: Sequence[int], corrupted_ids: Sequence[int], chosen: int, against: int,
         between: Callable[[], None] | None = None, batch_tokens: int = BATCH_TOKENS,
         clean: Trace | None = None) -> Plan:
    """Run both contexts (the corrupted one from its first difference, on the clean run's keys and values
    before it; the clean one unless its trace is given) -> the plan of the patched runs. Raises ValueError
    for contexts of different lengths, or equal ones."""
    first = edited_from(clean_ids, corrupted_ids)
    if clean is None:
        clean = trace(model, list(clean_ids), chosen, against, between=between)
    corrupted = trace(model, list(corrupted_ids), chosen, against, first, clean, between)
    return Plan(model, list(clean_ids), list(corrupted_ids), chosen, against, first, clean, corrupted,
                batch_tokens, between)


def patch(model: Any, clean_ids: Sequence[int], corrupted_ids: Sequence[int], chosen: int, against: int,
          batch_tokens: int = BATCH_TOKENS) -> Patching:
    """The whole map at once (tests, the benchmark)."""
    p = plan(model, clean_ids, corrupted_ids, chosen, against, batch_tokens=batch_tokens)
    out = p.empty()
    with torch.inference_mode():
        for cells in p.batches():
            out.fill(cells)
    return out


@torch.inference_mode()
def metric(model: Any, last: Tensor, chosen: int, against: int) -> Tensor:
    """last (B, C) final residuals at the last position -> (B,) float32 logit(chosen) - logit(against)."""
    logits: Tensor = model.lm_head(model.transformer.ln_f(last)).float()  # (B, V)
    return logits[:, chosen] - logits[:, against]


def trace(model: Any, ids: list[int], chosen: int, against: int, start: int = 0, past: Trace | None = None,
          between: Callable[[], None] | None = None, kept: KeysValues | None = None) -> Trace:
    """Run one context, keeping the residual stream, the heads' outputs and the keys and values at every
    layer and position. With `start`, positions before it are not run: they are `past`'s (a trace of the
    same tokens), or a kept KV cache's (`kept`: keys and values alone; the activations there, which no
    patched run reads, are held as zeros)."""
    device = next(model.parameters()).device
    before = past.keys_values if past is not None else kept
    run = torch.tensor([ids[start:]], dtype=torch.long, device=device)  # (1, T - start)
    out = hooked.run(model, hooked.embed(model, run, start), start=start, past=before if start > 0 else None,
                     reads=hooked.Reads(resid=True, z=True, keys_values=True), between=between)
    residuals, heads = out.stacked("resid")[:, 0], out.stacked("z")[:, 0]  # (L + 1, T - start, C), (L, nh, ...)
    keys_values = [out.keys_values[layer] for layer in sorted(out.keys_values)]
    if start > 0 and before is not None:
        if past is not None:  # the positions before start are the same in both runs
            residuals = torch.cat([past.residuals[:, :start], residuals], dim=1)
            heads = torch.cat([past.heads[:, :, :start], heads], dim=2)
        else:
            residuals = torch.cat([residuals.new_zeros(residuals.size(0), start, residuals.size(2)), residuals], 1)
            heads = torch.cat([heads.new_zeros(*heads.shape[:2], start, heads.size(3)), heads], dim=2)
        keys_values = [(torch.cat([pk[:, :, :start].to(k.dtype), k], dim=2),
                        torch.cat([pv[:, :, :start].to(v.dtype), v], dim=2))
                       for (pk, pv), (k, v) in zip(before, keys_values)]
    value = float(metric(model, residuals[-1, -1:], chosen, against)[0])
    return Trace(residuals, heads, keys_values, value, start if past is None else past.held_from)
