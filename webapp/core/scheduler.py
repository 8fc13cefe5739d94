"""The step scheduler: the core's policy, on plain data, apart from the worker that carries it out.

It holds the waiting jobs and answers the worker (webapp/core/engine.py), which then runs what it says
by calling the executors; it runs nothing itself, touches no model and starts no thread:

- `take`: which waiting jobs join their batch (in fair order across clients, while each batched
  executor has room) and which one whole job runs next;
- `positions`: each waiting job's place in its lane (the jobs waiting for a row of its batch, or the
  whole jobs): exactly the jobs it waits behind;
- `to_step`: which batched executors (models) step this turn, and in what order;
- `prefill_pass`: within a step, which newcomers prefill their next chunk, and how many tokens that is.

The worker calls `add`, `drop_cancelled`, `take` and `positions` under the core's lock.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from webapp.core.jobs import AnyJob


@dataclass(frozen=True)
class Newcomer:
    """A row still prefilling its prompt, as the scheduler sees it (BatchedJobs.newcomers)."""

    id: str  # its job's id
    left: int  # prompt tokens still to prefill
    chunk: int  # tokens per prefill chunk on its model: where its prompt is cut, alone or batched

    @property
    def next_chunk(self) -> int:
        """Tokens its next prefill chunk runs."""
        return min(self.left, self.chunk)


@dataclass(frozen=True)
class PrefillPass:
    """One prefill pass of a step: these rows run their next chunk, side by side where the model can."""

    rows: tuple[str, ...] = ()  # ids, in order of admission
    tokens: int = 0  # prompt tokens the pass runs


def prefill_pass(newcomers: Sequence[Newcomer], others_decoding: bool, used: int = 0) -> PrefillPass:
    """The newcomers (in order of admission) that prefill a chunk in this pass, each cut exactly as alone.

    While other rows are decoding: the oldest, and after it the next ones whose chunks still fit in one
    chunk's worth of tokens (its `chunk`), so a step never stalls the running rows for more than about one
    chunk of work, while a crowd of short prompts is still prefilled together instead of one a step. With
    no row decoding there is nobody to stall: every newcomer's next chunk runs, and a crowd arriving at an
    idle batch gets its first tokens together, after one pass, rather than each after the others' steps.
    `used`: tokens this step already prefilled (then even the oldest must fit)."""
    if not others_decoding:
        chosen = list(newcomers)
    elif not newcomers:
        return PrefillPass()
    else:
        budget, chosen = newcomers[0].chunk, []
        for newcomer in newcomers:
            if (chosen or used) and used + newcomer.next_chunk > budget:
                continue  # a shorter one behind it may still fit
            chosen.append(newcomer)
            used += newcomer.next_chunk
    return PrefillPass(tuple(n.id for n in chosen), sum(n.next_chunk for n in chosen))


class Scheduler:
    """The waiting jobs, and who is served next."""

    def __init__(self) -> None:
        self._queue: collections.deque[AnyJob] = collections.deque()  # waiting, in order of submission
        self._turns: dict[str, int] = {}  # client -> when it last had a job taken (fair order)
        self._turn = 0
        self._first: str | None = None  # the batched executor that stepped first last turn (to_step)

    def __len__(self) -> int:
        return len(self._queue)

    def waiting(self) -> list[AnyJob]:
        """The waiting jobs, in order of submission."""
        return list(self._queue)

    def add(self, job: AnyJob) -> None:
        self._queue.append(job)

    def drop_cancelled(self) -> list[AnyJob]:
        """Take the waiting jobs that were cancelled out of the queue: they never run."""
        cancelled = [j for j in self._queue if j.cancelled]
        for job in cancelled:
            self._queue.remove(job)
        return cancelled

    def take(self, room: Mapping[str, int], whole_too: bool) -> tuple[list[AnyJob], AnyJob | None]:
        """Take, in fair order, the waiting jobs of the batched kinds that their executors have room for
        (`room`: free rows per batched kind; every other kind is a whole job), and, when `whole_too`, the
        first whole job -> (the jobs to admit, the whole job to run)."""
        left = dict(room)
        admitted: list[AnyJob] = []
        whole = None
        for job in self.fair_order():
            if job.kind in left:
                if left[job.kind] > 0:
                    left[job.kind] -= 1
                    admitted.append(job)
            elif whole is None and whole_too:
                whole = job
        for job in admitted + ([whole] if whole else []):
            self._queue.remove(job)
            self._took(job)
        return admitted, whole

    def fair_order(self) -> list[AnyJob]:
        """The waiting jobs in the order they will be taken: round-robin across clients (by address, else
        by owner), each client's own jobs oldest first; the client served longest ago goes first (then
        the one whose oldest job is oldest). So one client's burst cannot push another client's first
        job behind all of it."""
        by_client: dict[str, collections.deque[AnyJob]] = {}
        for job in self._queue:
            by_client.setdefault(job.client or job.owner, collections.deque()).append(job)
        clients = sorted(by_client, key=lambda c: self._turns.get(c, 0))  # stable: oldest job breaks ties
        order, lanes = [], [by_client[c] for c in clients]
        while lanes:
            for lane in lanes:
                order.append(lane.popleft())
            lanes = [lane for lane in lanes if lane]
        return order

    def positions(self, batched: Collection[str]) -> list[tuple[AnyJob, int]]:
        """Each waiting job's place in its lane, among the jobs it really waits behind (in fair order): the
        jobs of its own batched kind, or (any other kind) the whole jobs."""
        places: collections.Counter[str] = collections.Counter()
        found = []
        for job in self.fair_order():
            lane = job.kind if job.kind in batched else "whole"
            places[lane] += 1
            found.append((job, places[lane]))
        return found

    def to_step(self, rows: Mapping[str, int]) -> list[str]:
        """The batched executors that step this turn, in order (`rows`: each one's rows, in the core's
        order): every one with rows, once, so one model's replies never wait for another's to end; the
        first place goes round, so no model's rows always wait for another's step. On the worker only."""
        order = list(rows)
        if self._first in order:
            after = order.index(self._first) + 1
            order = order[after:] + order[:after]
        chosen = [kind for kind in order if rows[kind]]
        if chosen:
            self._first = chosen[0]
        return chosen

    def _took(self, job: AnyJob) -> None:
        """Note that this job's client was served now."""
        self._turn += 1
        self._turns[job.client or job.owner] = self._turn
        if len(self._turns) > 4096:  # bounded: forget clients with nothing waiting (they rank as new)
            waiting = {j.client or j.owner for j in self._queue}
            self._turns = {c: t for c, t in self._turns.items() if c in waiting}


__all__ = ["Newcomer", "PrefillPass", "Scheduler", "prefill_pass"]
