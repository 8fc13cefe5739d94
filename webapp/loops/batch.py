"""Loop-lab runs stepped together: the core's batched executor for a model that can (supports_batched_loops).

Every running run is a row. A step of the batch is one loop of every row: one forward per model (and
prompt length) carrying every running table, each at its own loop (LoopTransformer.start/step). A row
stops on its own completion head (or at the safety cap), is cancelled (Stop) or fails on its own; rows
join at the next step after they are admitted. Each row's numbers are the ones it gets alone, bit for
bit at float32 on the CPU (rowwise_linear), and its rows are published and scored by the code a run alone
uses (webapp/loops/trace.py), so a run's trace is the same alone or in a batch. Its steps are bulk work:
the core counts their time against the bulk share (BatchedJobs.bulk), so chat replies keep their rate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from webapp.core.executors import BatchedJobs, Finished, StepReport, Worker
from webapp.core.jobs import CANCELLED, DONE, FAILED, Job
from webapp.core.threads import torch_threads
from webapp.loops.model.looped import LoopRows
from webapp.loops.reading import supports_attention
from webapp.loops.request import DemoRequest
from webapp.loops.runs import MAIN, LoopResult, LoopRuns
from webapp.loops.task import PROMPT_LENGTH
from webapp.loops.trace import (
    FLUSH_SECONDS,
    NONFINITE,
    SAFETY_CAP,
    STOP_THRESHOLD,
    RowsEvent,
    TraceBuilder,
    check_model,
    complete,
    loop_rows,
)

MAX_ROWS = 1024  # runs stepping at once; one loop of them all is a few milliseconds on the bundled model
STARTS_PER_STEP = 64  # prompts read per step, so a burst of runs joining never stalls a step for long

LoopJob = Job[DemoRequest, LoopResult]


def batches(bundle: Any) -> bool:
    """Whether this bundle's model steps runs together (the project's LoopTransformer does; an owner's
    model through the factory contract need not, and then runs alone: webapp/loops/runs.py)."""
    return getattr(bundle.model, "supports_batched_loops", False) is True


@dataclass
class Row:
    job: LoopJob
    bundle: Any
    builder: TraceBuilder
    pairs: list | None = None  # the prompt's rules, when the model's attention can say which it read
    started: float = 0.0
    flushed: float = 0.0
    pending: list[dict] = field(default_factory=list)  # rows not yet published
    group: tuple | None = None  # (model name, prompt length) once its prompt is read


@dataclass
class Group:
    """The rows of one model and prompt length: they loop in one forward."""

    bundle: Any
    ids: list[str] = field(default_factory=list)
    state: Any = None  # LoopRows of ids, in order
    joining: list[tuple[str, Any]] = field(default_factory=list)  # (id, its LoopRows) for the next step


class LoopBatch(BatchedJobs[DemoRequest, LoopResult]):
    """Loop-lab runs of the models that step together, as rows of batches."""

    bulk = True

    def __init__(self, runs: LoopRuns, max_rows: int = MAX_ROWS) -> None:
        self.runs, self.max_rows = runs, max_rows
        self._rows: dict[str, Row] = {}  # in order of admission
        self._groups: dict[tuple, Group] = {}

    @property
    def rows(self) -> int:
        return len(self._rows)

    def steps(self, model: str) -> bool:
        """Whether runs of this model (by its name in the picker) step here."""
        bundle = self.runs.bundles.get(model, self.runs.bundle)
        return batches(bundle)

    def admit(self, job: LoopJob) -> None:
        name = getattr(job.request, "model", MAIN)
        bundle = self.runs.bundles.get(name, self.runs.bundle)
        check_model(bundle.model)
        if not isinstance(job.result, LoopResult):
            job.result = LoopResult()
        self._rows[job.id] = Row(job, bundle, TraceBuilder(job.request))

    def step(self, core: Worker) -> StepReport:
        report = StepReport()
        clock = time.perf_counter()
        with torch_threads(self.runs.torch_threads), torch.inference_mode():
            for row in list(self._rows.values()):
                if row.job.cancelled:
                    report.finished.append(self._end(row, CANCELLED, core))
            starting = [row for row in self._rows.values() if row.group is None][:STARTS_PER_STEP]
            for row in starting:
                try:
                    self._start(row)
                except Exception as exc:  # this run fails; the batch goes on
                    report.finished.append(self._end(row, FAILED, core, _message(exc)))
            for key, group in list(self._groups.items()):
                self._loop(key, group, report, core)
        report.spent("decode", time.perf_counter() - clock)
        return report

    def _start(self, row: Row) -> None:
        request, bundle = row.job.request, row.bundle
        prompt = bundle.render_prompt(list(request.pairs), request.start, request.steps)
        encoded = bundle.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
        ids = encoded["input_ids"]
        if supports_attention(bundle.model) and ids.shape[-1] == len(prompt) == PROMPT_LENGTH:
            row.pairs = list(request.pairs)
        device = next(bundle.model.parameters()).device
        row.started = row.flushed = time.perf_counter()
        state, _ = bundle.model.start(ids.to(device), encoded["attention_mask"].to(device),
                                      list(bundle.readout_token_ids))
        key = (getattr(request, "model", MAIN), ids.shape[-1])
        group = self._groups.setdefault(key, Group(bundle))
        group.joining.append((row.job.id, state))
        row.group = key

    def _loop(self, key: tuple, group: Group, report: StepReport, core: Worker) -> None:
        """One loop of every row of the group; the rows that stopped leave it."""
        self._join(group)
        if not group.ids:
            del self._groups[key]
            return
        rows = [self._rows[i] for i in group.ids]
        model = group.bundle.model
        try:
            out, after = model.step(group.state, list(group.bundle.readout_token_ids))
        except Exception as exc:  # the step failed for every row in it
            for row in rows:
                report.finished.append(self._end(row, FAILED, core, _message(exc), leave_group=False))
            group.ids, group.state = [], None
            return
        now = time.perf_counter()
        loops = group.state.loops.tolist()
        direct = out.state_logits.argmax(-1).tolist()
        # one model and prompt length: every row of the group can say which rule it read, or none
        attention = out.attention if all(r.pairs is not None for r in rows) else None
        made, finite = loop_rows(loops, out.scores, out.stop_logits, direct, [now - r.started for r in rows],
                                 attention, [r.pairs for r in rows], out.state_change)
        stops = out.stop_logits.float().sigmoid().tolist()
        keep = []
        for i, row in enumerate(rows):
            if not finite[i]:  # its rows up to the last finite loop stay; it fails, as alone
                report.finished.append(self._end(row, FAILED, core, NONFINITE, leave_group=False))
                continue
            row.pending.append(row.builder.add(made[i]))
            report.rows += 1
            if stops[i] >= STOP_THRESHOLD or loops[i] >= SAFETY_CAP:
                self._publish(row, core, ended=False)
                row.job.result.snapshot = complete(row.job.request, row.bundle.checkpoint_id, row.builder.rows,
                                                   stops[i], row.started)
                report.finished.append(self._end(row, DONE, core, leave_group=False))
                continue
            if loops[i] == 1 or now - row.flushed >= FLUSH_SECONDS:
                self._publish(row, core, ended=False)
            keep.append(i)
        if len(keep) < len(rows):
            index = torch.tensor(keep, dtype=torch.long)
            after = after.take(index) if keep else None
            group.ids = [group.ids[i] for i in keep]
        group.state = after

    def _join(self, group: Group) -> None:
        """The rows whose prompts were read join the group's batch."""
        if not group.joining:
            return
        parts = ([group.state] if group.ids and group.state is not None else []) + [s for _, s in group.joining]
        group.ids = (group.ids if group.state is not None else []) + [i for i, _ in group.joining]
        group.state = LoopRows.cat(parts)
        group.joining = []

    def _publish(self, row: Row, core: Worker, ended: bool) -> None:
        row.flushed = time.perf_counter()
        if not row.pending:
            return
        rows, row.pending = row.pending, []
        core.count("rows", len(rows), row.job)
        row.job.keep("rows", RowsEvent(rows))  # keep: a cancelled run's last rows are still shown

    def _end(self, row: Row, outcome: str, core: Worker, error: str | None = None,
             leave_group: bool = True) -> Finished:
        """The row leaves the batch: its last rows published, its place in its group freed (by the caller
        where it is in the middle of stepping the group)."""
        self._publish(row, core, ended=True)
        del self._rows[row.job.id]
        if leave_group and row.group is not None and row.group in self._groups:
            group = self._groups[row.group]
            group.joining = [(i, s) for i, s in group.joining if i != row.job.id]
            if row.job.id in group.ids:
                keep = [i for i, rid in enumerate(group.ids) if rid != row.job.id]
                if group.state is not None:
                    group.state = group.state.take(torch.tensor(keep, dtype=torch.long)) if keep else None
                group.ids = [group.ids[i] for i in keep]
        return Finished(row.job, outcome, error)


def _message(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
