"""What the core's worker executes: one executor per kind of job, given by the app at start-up.

The core decides what runs at each step (its scheduler plans, its worker calls the executors); an
executor knows how to run one kind of request on the device. Two kinds, told apart by type:

- `WholeJobs`: a job runs from start to end in one call (a Loop-lab run; a chat reply on a model
  without a KV cache). One at a time, between the batched steps.
- `BatchedJobs`: jobs are rows of a batch. The core admits waiting jobs while there is room, then
  steps it again and again; each step does a bounded amount of work for every row and reports the rows
  that finished. A step is driven by the worker, in phases: `begin_step()`; the prefill passes the
  scheduler plans on `newcomers()` (`prefill(ids)`: the next chunk of each of those rows); then
  `step()`: one decoding step for every decoding row, and the retired rows. The executor runs what it
  is told: which newcomers prefill, and when, is the scheduler's (webapp/core/scheduler.py).

Executors run on the worker thread only; they never see Flask, and they publish to their jobs with
`job.keep(...)` (a cancelled job is retired by the executor at its next step).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol

from webapp.core.jobs import AnyJob, Job, JobState, RequestT, ResultT
from webapp.core.scheduler import Newcomer


class Worker(Protocol):
    """The core as an executor sees it, on the worker thread."""

    def count(self, name: str, n: int = 1, job: AnyJob | None = None) -> None:
        """Add to a production counter (tokens, loop rows) and to the job's own counts."""

    def interleave(self) -> None:
        """Between a whole job's units of work: let the batch take a step when it is due."""

    def others_waiting(self, executor: object) -> bool:
        """Whether work other than this executor's is queued or running (a step should then stay short)."""


def between_units(job: AnyJob, core: Worker) -> Callable[[], None]:
    """What a whole job calls between its units of work (layers, loops, batches of cells): running replies
    step when they are due, and a cancelled job stops there."""
    def between() -> None:
        core.interleave()
        job.raise_if_cancelled()
    return between


class WholeJobs(ABC, Generic[RequestT, ResultT]):
    """Runs the jobs of one kind, Job[RequestT, ResultT]."""

    @abstractmethod
    def run(self, job: Job[RequestT, ResultT], core: Worker) -> None:
        """Run the job to its end; raise JobCancelled once it is cancelled, anything else to fail it."""


@dataclass
class Finished:
    job: AnyJob
    outcome: JobState  # DONE, CANCELLED or FAILED
    error: str | None = None


@dataclass
class StepReport:
    finished: list[Finished] = field(default_factory=list)
    rows: int = 0  # rows that decoded a token in this step
    prefill_tokens: int = 0  # prompt tokens prefilled in this step
    # seconds of the step spent per phase ("prefill", "decode", "publish"): where the worker's time goes
    phases: dict[str, float] = field(default_factory=dict)

    def spent(self, phase: str, seconds: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    def add(self, other: StepReport) -> None:
        """Count another phase of the same step in this report."""
        self.finished += other.finished
        self.rows += other.rows
        self.prefill_tokens += other.prefill_tokens
        for phase, seconds in other.phases.items():
            self.spent(phase, seconds)


class BatchedJobs(ABC, Generic[RequestT, ResultT]):
    """Runs the jobs of one kind, Job[RequestT, ResultT], as rows of a batch."""

    max_rows: int
    # Bulk work (Loop-lab runs stepped together), not replies someone is reading as they come: its steps
    # take the bulk share of the worker's time as whole jobs do (scheduler.BulkShare), paid back to the
    # reply batches after each step, and it is not a reply batch whole jobs pay back to.
    bulk: bool = False

    @property
    @abstractmethod
    def rows(self) -> int:
        """Jobs admitted and not finished yet."""

    @abstractmethod
    def admit(self, job: Job[RequestT, ResultT]) -> None:
        """Take a job into the batch (its work starts at the next step)."""

    def begin_step(self) -> None:  # noqa: B027 (a hook: most executors have nothing to start)
        """Start a step: the rows whose jobs were cancelled stop (step() retires them)."""

    def newcomers(self) -> list[Newcomer]:
        """The rows still prefilling their prompts, in order of admission, as the scheduler plans on them
        (none where the executor prefills nothing)."""
        return []

    def decoding(self) -> bool:
        """Whether a row is decoding (then a step's prefill must not stall it for long)."""
        return False

    def prefill(self, rows: Sequence[str], core: Worker) -> StepReport:
        """One prefill pass within a step: the next chunk of each of these rows (ids from newcomers())."""
        raise NotImplementedError(f"{type(self).__name__} has no rows to prefill")

    @abstractmethod
    def step(self, core: Worker) -> StepReport:
        """The rest of the step, after its prefill passes: one bounded step of work for the rows (one
        decoding step for every decoding row); report the ones that finished."""

    def memory_bytes(self) -> int:
        """Device memory the executor holds for rows and kept caches (for /metrics)."""
        return 0


Executor = WholeJobs[Any, Any] | BatchedJobs[Any, Any]
