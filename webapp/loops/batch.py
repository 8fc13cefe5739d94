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
from webapp.core.jobs import CANCELLED, DONE, FAILED, Job, JobState
from webapp.core.threads import torch_threads
from webapp.loops.model.loop_state import LoopRows
from webapp.loops.reading import supports_attention
from webapp.loops.request import DemoRequest
from webapp.loops.runs import MAIN, LoopResult, LoopRuns
from webapp.loops.task import PROMPT_LENGTH
from webapp.loops.trace import (
    FLUSH_SECONDS,
    NONFINITE,
    RowsEvent,
    TraceBuilder,
    check_model,
    complete,
    loop_rows,
    loops_to_run,
)

MAX_ROWS = 1024  # runs admitted at once
# Rows of one forward: a step of the batch loops one lane of at most this many rows, the lanes in turn,
# so that a chat reply arriving waits for one short forward, not for a sweep's every row.
LANE_ROWS = 256
# Prompts read per step (at least one), so a burst of runs joining never stalls a step: this long when the
# core has nothing else to do, SHARED_START_SECONDS when other work waits (a chat reply's first token waits
# for the step in progress).
START_SECONDS = 0.005
SHARED_START_SECONDS = 0.0015

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
    states: list[torch.Tensor] = field(default_factory=list)  # each loop's state (webapp/loops/states.py)
    group: tuple | None = None  # (model name, prompt length) once its prompt is read


@dataclass
class Group:
    """The rows of one model and prompt length: they loop in one forward."""

    bundle: Any
    ids: list[str | None] = field(default_factory=list)  # None: a row that ended (a hole, _compact)
    state: Any = None  # LoopRows of ids, in order
    joining: list[tuple[str, Any]] = field(default_factory=list)  # (id, its LoopRows) for the next step

    @property
    def size(self) -> int:
        """Rows in it, and joining it."""
        return sum(i is not None for i in self.ids) + len(self.joining)


class LoopBatch(BatchedJobs[DemoRequest, LoopResult]):
    """Loop-lab runs of the models that step together, as rows of batches."""

    bulk = True

    def __init__(self, runs: LoopRuns, max_rows: int = MAX_ROWS) -> None:
        self.runs, self.max_rows = runs, max_rows
        self._rows: dict[str, Row] = {}  # in order of admission
        self._groups: dict[tuple, Group] = {}  # (model name, prompt length, lane) -> its rows
        self._turn = 0  # which lane loops next

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
            for row in [row for row in self._rows.values() if row.group is None]:
                try:
                    self._start(row)
                except Exception as exc:  # this run fails; the batch goes on
                    report.finished.append(self._end(row, FAILED, core, _message(exc)))
                spent = time.perf_counter() - clock  # checked after each prompt: a reply may have come since
                if spent >= START_SECONDS or spent >= SHARED_START_SECONDS and core.others_waiting(self):
                    break
            if self._groups:
                self._turn = (self._turn + 1) % len(self._groups)
                key = list(self._groups)[self._turn]
                self._loop(key, self._groups[key], report, core)
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
        kind = (getattr(request, "model", MAIN), ids.shape[-1])
        lanes = [k for k in self._groups if k[:2] == kind]
        key = next((k for k in lanes if self._groups[k].size < LANE_ROWS),
                   (*kind, max((k[2] for k in lanes), default=-1) + 1))
        group = self._groups.setdefault(key, Group(bundle))
        group.joining.append((row.job.id, state))
        row.group = key

    def _loop(self, key: tuple, group: Group, report: StepReport, core: Worker) -> None:
        """One loop of every row of the group; the rows that stopped leave it."""
        self._join(group)
        live = [i for i, row_id in enumerate(group.ids) if row_id is not None]
        if not live:
            del self._groups[key]
            return
        rows = [self._rows[row_id] for row_id in group.ids if row_id is not None]
        model = group.bundle.model
        try:
            out, after = model.step(group.state, list(group.bundle.readout_token_ids))
        except Exception as exc:  # the step failed for every row in it
            for row in rows:
                report.finished.append(self._end(row, FAILED, core, _message(exc)))
            group.ids, group.state = [], None
            return
        now = time.perf_counter()
        index = torch.tensor(live, dtype=torch.long)
        loops = group.state.loops[index].tolist()
        direct = out.state_logits[index].argmax(-1).tolist()
        # one model and prompt length: every row of the group can say which rule it read, or none
        attention = out.attention[index] if all(r.pairs is not None for r in rows) else None
        made, finite = loop_rows(loops, out.scores[index], out.stop_logits[index], direct,
                                 [now - r.started for r in rows], attention, [r.pairs for r in rows],
                                 out.state_change[index])
        stops = out.stop_logits[index].float().sigmoid().tolist()
        given = getattr(out, "state", None)
        states = None if given is None else given[index]
        for n, row in enumerate(rows):
            if not finite[n]:  # its rows up to the last finite loop stay; it fails, as alone
                report.finished.append(self._end(row, FAILED, core, NONFINITE))
                continue
            row.pending.append(row.builder.add(made[n]))
            if states is not None:
                row.states.append(states[n])
            report.rows += 1
            last_loop, threshold = loops_to_run(row.job.request)
            if stops[n] >= threshold or loops[n] >= last_loop:
                self._publish(row, core, ended=False)
                try:  # scoring and the state's measures: a failure fails this run, never the batch
                    row.job.result.snapshot = complete(row.job.request, row.bundle.checkpoint_id, row.builder.rows,
                                                       stops[n], row.started, row.states, row.job)
                except Exception as exc:
                    report.finished.append(self._end(row, FAILED, core, _message(exc)))
                    continue
                report.finished.append(self._end(row, DONE, core))
                continue
            if loops[n] == 1 or now - row.flushed >= FLUSH_SECONDS:
                self._publish(row, core, ended=False)
        group.state = after
        self._compact(group)

    @staticmethod
    def _compact(group: Group) -> None:
        """Rows that ended leave a hole that keeps stepping (its outputs unread: no row's numbers depend on
        another's); the batch is rebuilt without them once they are a quarter of it, as copying every
        row's prompt keys and values at each ending would cost more than the holes."""
        live = [i for i, row_id in enumerate(group.ids) if row_id is not None]
        holes = len(group.ids) - len(live)
        if not holes or 4 * holes < len(group.ids) and live:
            return
        group.state = group.state.take(torch.tensor(live, dtype=torch.long)) if live else None
        group.ids = [group.ids[i] for i in live]

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

    def _end(self, row: Row, outcome: JobState, core: Worker, error: str | None = None) -> Finished:
        """The row leaves the batch: its last rows published, its place in its group a hole (_compact)."""
        self._publish(row, core, ended=True)
        del self._rows[row.job.id]
        group = self._groups.get(row.group) if row.group is not None else None
        if group is not None:
            group.joining = [(i, s) for i, s in group.joining if i != row.job.id]
            group.ids = [None if i == row.job.id else i for i in group.ids]
        return Finished(row.job, outcome, error)


def _message(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
