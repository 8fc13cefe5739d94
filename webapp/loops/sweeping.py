"""Running a sweep: each of its runs is an ordinary Loop-lab run job (LoopService.start), so the core's
limits, its fairness and its batching of runs apply to them as to any run.

A sweep itself is a Job that is never queued on the core: a thread of this front end submits its runs a
few at a time, counts each one's summary and publishes a `line` event per finished (model, k), then
a `summary` event, and saves the whole as one snapshot beside the traces (TraceStore.save_sweep).
Streams follow it as they follow a run (Job.subscribe); the last one leaving, or Stop, cancels it and
the runs it has in flight.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import threading
from dataclasses import dataclass, field

from webapp.core import Refused
from webapp.core.jobs import CANCELLED, DONE, FAILED, RUNNING, Job
from webapp.core.refusals import CoreClosed, TooManyFromClient, TooManyJobs
from webapp.loops.probe import ProbeRun, decodability, paths
from webapp.loops.service import LoopService
from webapp.loops.states import near_k
from webapp.loops.sweep import SweepSpec, disagreements, k_line, plan, totals
from webapp.loops.task import execute

log = logging.getLogger("glassbox.loops.sweep")
SWEEPS_PER_OWNER = 1   # a browser (or an API key, or a cookie-less call) runs one sweep at a time
SWEEPS_PER_CLIENT = 2  # an address runs at most two, whatever cookies it sends
WAIT_SECONDS = 0.25    # how often a sweep refused by the core's limits tries again
KEEP_FINISHED = 16  # finished sweeps kept for a late stream (their lines; saved ones are in the store)
ALONE_IN_FLIGHT = 3  # a sweep's runs in flight on a model whose runs cannot step together
PROBE_RUNS = 500  # runs per model whose states a sweep keeps for its probe (webapp/loops/probe.py), shared by its k


@dataclass
class SweepResult:
    # per model, the summary of each table's run in plan order (None: not finished yet)
    summaries: dict[str, list[dict | None]] = field(default_factory=dict)
    lines: list[dict] = field(default_factory=list)  # the (model, k) lines published so far
    summary: dict | None = None
    sweep_id: str | None = None  # where it was saved
    probe_runs: dict[str, list[ProbeRun]] = field(default_factory=dict)  # per model, the runs that gave states
    readout: dict[str, list[tuple[int, bool]]] = field(default_factory=dict)  # per model, (loop, right) of each row
    paths: dict[str, list[dict]] = field(default_factory=dict)  # per model, its runs' paths so far (probe.paths)
    near_k: dict[str, dict[int, list[dict]]] = field(default_factory=dict)  # per model and run, states.near_k


SweepJob = Job[SweepSpec, SweepResult]


class Sweeps:
    def __init__(self, service: LoopService, in_flight: int = 3) -> None:
        self.service = service
        self.in_flight = in_flight  # runs of one sweep queued or running at once
        self._jobs: dict[str, SweepJob] = {}
        self._lock = threading.Lock()

    def start(self, owner: str, client: str, spec: SweepSpec) -> SweepJob:
        """Raises Refused (the browser's, or the address's, sweep already running; the server closing)."""
        if not self.service.core.accepting:
            raise CoreClosed()
        job: SweepJob = Job("sweep", owner, spec, client=client, result=SweepResult(
            summaries={m: [None] * (spec.total // len(spec.models)) for m in spec.models}))
        with self._lock:
            active = [j for j in self._jobs.values() if not j.finished_state]
            if sum(j.owner == owner for j in active) >= SWEEPS_PER_OWNER:
                raise TooManyJobs()
            if client and sum(j.client == client for j in active) >= SWEEPS_PER_CLIENT:
                raise TooManyFromClient()
            self._jobs[job.id] = job
            finished = [i for i, j in self._jobs.items() if j.finished_state]
            for old in finished[:max(0, len(finished) - KEEP_FINISHED)]:
                del self._jobs[old]
        context = contextvars.copy_context()  # the runs count against the address that asked (CLIENT)
        threading.Thread(target=context.run, args=(self._drive, job), name="glassbox-sweep", daemon=True).start()
        return job

    def job(self, owner: str, job_id: str) -> SweepJob | None:
        with self._lock:
            job = self._jobs.get(job_id)
        return job if job is not None and job.owner == owner else None

    # -- the sweep's own thread ----------------------------------------------------------------
    def _drive(self, job: SweepJob) -> None:
        try:
            job.set_state(RUNNING)
            self._run(job)
        except Exception as error:  # a run failed, or saving did: the sweep ends with the reason
            log.exception("sweep %s failed", job.id)
            job.set_state(FAILED, str(error) or type(error).__name__)
            return
        finally:  # the runs' states and rows were for the probe, which is done (or will not be)
            job.result.probe_runs.clear()
            job.result.readout.clear()
            job.result.near_k.clear()
        job.set_state(CANCELLED if job.cancelled else DONE)

    def _run(self, job: SweepJob) -> None:
        spec, result = job.request, job.result
        tables = plan(spec)
        todo = [(index, model) for index in range(len(tables)) for model in spec.models]
        todo.reverse()  # popped from the end: k by k, table by table
        ended: list[tuple[int, str, Job, str, str | None]] = []
        changed = threading.Condition()
        running: dict[tuple[int, str], Job] = {}
        left = {(model, k): spec.tables for model in spec.models for k in spec.ks}
        width = self._width(spec)  # runs in flight at once

        def submit(index: int, model: str) -> bool:
            k, _, request = tables[index]

            def then(run, outcome, error):
                with changed:
                    ended.append((index, model, run, outcome, error))
                    changed.notify_all()
            try:
                run = self.service.start(job.owner, dataclasses.replace(request, model=model, keep_states=True),
                                         save=False, then=then, group=job.id)
            except CoreClosed:
                raise
            except Refused:  # the browser's or the address's runs are at their limit: try again later
                return False
            run.watched_elsewhere()  # followed by this thread, not by a stream: not an orphan
            running[(index, model)] = run
            return True

        try:
            while todo or running:
                if job.cancelled:
                    return
                while todo and len(running) < width and submit(*todo[-1]):
                    todo.pop()
                with changed:
                    if not ended:
                        changed.wait(WAIT_SECONDS)
                    done, ended[:] = list(ended), []
                for index, model, run, outcome, error in done:
                    running.pop((index, model), None)
                    if outcome != DONE or run.result.snapshot is None:
                        if job.cancelled:
                            return
                        raise RuntimeError(f"A run of the sweep {outcome}: {error or 'stopped'}")
                    result.summaries[model][index] = run.result.snapshot["summary"]
                    self._keep_for_probe(job, model, tables, index, run)
                    k = tables[index][0]
                    left[(model, k)] -= 1
                    if not left[(model, k)]:
                        self._publish_line(job, model, k, tables)
        finally:
            for run in running.values():
                run.cancel()
        self._finish(job, tables)

    def _width(self, spec: SweepSpec) -> int:
        """Runs in flight: as many as the batch steps together, or ALONE_IN_FLIGHT where a model's runs run
        one at a time (an owner's model): a queue full of one sweep's would keep others' whole jobs waiting."""
        if all(self.service.steps_together(m) for m in spec.models):
            return self.in_flight
        return min(self.in_flight, ALONE_IN_FLIGHT)

    @staticmethod
    def _keep_for_probe(job: SweepJob, model: str, tables, index: int, run: Job) -> None:
        """A finished run's states and rows, for the probe: held out by table number within its k (by
        plan order when there is one table per k)."""
        result, states = job.result, run.result.states
        run.result.states = None  # read once: the run's job is kept a while by the core, its states need not be
        k, number, request = tables[index]
        held = number if job.request.tables > 1 else index  # odd: held out from the probe's training
        result.near_k.setdefault(model, {})[index] = near_k(run.result.snapshot["trace"], k)
        if held % 2:  # the model's own readout, on the held-out runs the probe is tested on
            result.readout.setdefault(model, []).extend(
                (row["loop"], bool(row["correct"])) for row in run.result.snapshot["trace"])
        kept = result.probe_runs.setdefault(model, [])
        # at most a share of PROBE_RUNS per k, so every k has runs to train and test on (and paths to draw)
        if states is None or sum(r.k == k for r in kept) >= max(4, PROBE_RUNS // len(job.request.ks)):
            return
        letters = [request.start] + execute(request.mapping, request.start, states.size(0))
        kept.append(ProbeRun(held, states, letters, k))

    def _publish_line(self, job: SweepJob, model: str, k: int, tables) -> None:
        result = job.result
        indices = [i for i, (kk, _, _) in enumerate(tables) if kk == k]
        summaries = [result.summaries[model][i] for i in indices]
        line = {"model": model, **k_line(k, summaries),  # type: ignore[arg-type]
                "stop_near_k": mean_near_k([result.near_k.get(model, {}).get(i, []) for i in indices])}
        if result.probe_runs.get(model):  # the paths fill in as each k finishes (the probe waits for the end)
            result.paths[model] = paths(result.probe_runs[model])
        result.lines.append(line)
        # the runs only when asked for ("runs": true): a page never shows them, and they are most of a line
        runs = ([{"request": tables[i][2].payload(), "summary": s} for i, s in zip(indices, summaries)]
                if job.request.runs else [])
        job.emit("line", {"line": line, "runs": runs, "count": len(result.lines)})

    def _finish(self, job: SweepJob, tables) -> None:
        spec, result = job.request, job.result
        by_model = {m: totals(line for line in result.lines if line["model"] == m) for m in spec.models}
        differ = disagreements(spec, result.summaries)
        probes = {m: decodability(result.probe_runs[m], result.readout.get(m)) for m in spec.models
                  if result.probe_runs.get(m)}
        summary = {"status": "complete", "sweep": spec.payload(), "n": spec.total, "models": by_model,
                   "probe": {m: p for m, p in probes.items() if p is not None},
                   "paths": {m: paths(result.probe_runs[m]) for m in spec.models if result.probe_runs.get(m)},
                   "disagreements": [{"k": tables[i][0], "table": tables[i][1], "request": tables[i][2].payload(),
                                      "summaries": {m: result.summaries[m][i] for m in spec.models}}
                                     for i in differ]}
        snapshot = {"sweep": 1, "spec": spec.payload(), "lines": result.lines, "summaries": result.summaries,
                    "summary": summary}
        result.sweep_id = self.service.store.save_sweep(job.owner, snapshot)
        result.summary = {**summary, "sweep_id": result.sweep_id}
        job.emit("summary", result.summary)


def mean_near_k(runs: list[list[dict]]) -> dict[str, float]:
    """The mean stop probability at each of k−100 … k+1 over a k's runs that reached that loop."""
    by_label: dict[str, list[float]] = {}
    for run in runs:
        for point in run:
            by_label.setdefault(point["label"], []).append(point["probability"])
    return {label: sum(ps) / len(ps) for label, ps in by_label.items()}
