"""What the core's worker executes: one executor per kind of job, given by the app at start-up.

The core decides what runs at each step; an executor knows how to run one kind of request on the
device. Two kinds, told apart by type:

- `WholeJobs`: a job runs from start to end in one call (a Loop-lab run; a chat reply on a model
  without a KV cache). One at a time, between the batched steps.
- `BatchedJobs`: jobs are rows of a batch. The core admits waiting jobs while there is room, then
  calls `step()` again and again; each step does a bounded amount of work for every row (a prefill
  chunk for one newcomer, one decoding step for all) and reports the rows that finished.

Executors run on the worker thread only; they never see Flask, and they publish to their jobs with
`job.keep(...)` (a cancelled job is retired by the executor at its next step).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

from webapp.core.jobs import Job


class Worker(Protocol):
    """The core as an executor sees it, on the worker thread."""

    def count(self, name: str, n: int = 1, job: Job | None = None) -> None:
        """Add to a production counter (tokens, loop rows) and to the job's own counts."""

    def interleave(self) -> None:
        """Between a whole job's units of work: let the batch take a step when it is due."""

    def admit_waiting(self) -> None:
        """Within a batched step: admit the waiting jobs its executor has room for now (executor.admit)."""


class WholeJobs(ABC):
    @abstractmethod
    def run(self, job: Job, core: Worker) -> None:
        """Run the job to its end; raise JobCancelled once it is cancelled, anything else to fail it."""


@dataclass
class Finished:
    job: Job
    outcome: str  # DONE, CANCELLED or FAILED
    error: str | None = None


@dataclass
class StepReport:
    finished: list[Finished] = field(default_factory=list)
    rows: int = 0  # rows that decoded a token in this step
    prefill_tokens: int = 0  # prompt tokens prefilled in this step
    # seconds of the step spent per phase ("prefill", "decode", "publish"): where the worker's time goes
    phases: dict[str, float] = field(default_factory=dict)


class BatchedJobs(ABC):
    max_rows: int

    @property
    @abstractmethod
    def rows(self) -> int:
        """Jobs admitted and not finished yet."""

    @abstractmethod
    def admit(self, job: Job) -> None:
        """Take a job into the batch (its work starts at the next step)."""

    @abstractmethod
    def step(self, core: Worker) -> StepReport:
        """Do one bounded step of work for the rows; report the ones that finished."""

    def memory_bytes(self) -> int:
        """Device memory the executor holds for rows and kept caches (for /metrics)."""
        return 0


Executor = WholeJobs | BatchedJobs
