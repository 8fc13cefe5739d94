"""The step scheduler: the core's policy, on plain data, apart from the worker that carries it out.

It holds the waiting jobs and answers the worker (webapp/core/engine.py), which then runs what it says
by calling the executors; it runs nothing itself, touches no model and starts no thread:

- `take`: which waiting jobs join their batch (in fair order across clients, while each batched
  executor has room) and which one whole job runs next (the client that has had the least of the
  worker's time for whole jobs goes first: `charge`); `take_beside`: which one runs within a long one,
  between its units, for a client that has had less;
- `BulkShare`: how much of the worker's time whole jobs may take while replies are running;
- `positions`: each waiting job's place in its lane (the jobs waiting for a row of its batch, or the
  whole jobs): exactly the jobs it waits behind;
- `to_step`: which batched executors (models) step this turn, and in what order;
- `prefill_pass`: within a step, which newcomers prefill their next chunk, and how many tokens that is.

The worker calls `add`, `drop_cancelled`, `take` and `positions` under the core's lock.
"""

from __future__ import annotations

import collections
import threading
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


class BulkShare:
    """Whole jobs (Inside, Loop-lab runs) take at most `share` of the worker's time while replies are
    running: each second a whole job runs while a batch has rows is owed back to the batch as
    (1 - share) / share seconds of batched steps, paid before the whole job goes on (at its next
    InferenceCore.interleave) or the next one starts. With no reply running nothing is owed, and whole
    jobs run back to back. Plain numbers; the worker measures the seconds.

    Whole work done off the worker counts too: the CPU time request threads spend on bulk answers (an
    Inside report's JSON, a refusal of one) takes the same interpreter and cores from the replies, so it
    is owed back alike (`ran_elsewhere`, from any thread; the worker takes it in at its next `ran_whole`)."""

    def __init__(self, share: float = 0.5) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"the bulk share must be in (0, 1], not {share}")
        self.share = share
        self.owed = 0.0  # seconds of batched steps owed to the replies
        self._elsewhere = 0.0  # bulk seconds spent by request threads, not yet taken in
        self._lock = threading.Lock()

    def ran_elsewhere(self, seconds: float) -> None:
        """Request threads spent this long on bulk answers (any thread)."""
        with self._lock:
            self._elsewhere += seconds

    def ran_whole(self, seconds: float, replies_waiting: bool) -> None:
        """A whole job held the worker this long; `replies_waiting`: a batch had rows meanwhile. (On the
        worker.) Bulk time spent elsewhere since the last call is owed for too."""
        with self._lock:
            seconds, self._elsewhere = seconds + self._elsewhere, 0.0
        if replies_waiting:
            self.owed += seconds * (1 - self.share) / self.share

    def stepped(self, seconds: float) -> None:
        """The batches stepped this long."""
        self.owed = max(0.0, self.owed - seconds)

    def settle(self) -> None:
        """No reply is left to pay: nothing is owed."""
        self.owed = 0.0

    @property
    def due(self) -> bool:
        """Whether the batches are still owed steps before whole work goes on."""
        return self.owed > 0


class Scheduler:
    """The waiting jobs, and who is served next."""

    def __init__(self) -> None:
        self._queue: collections.deque[AnyJob] = collections.deque()  # waiting, in order of submission
        self._turns: dict[str, int] = {}  # client -> when it last had a job taken (fair order)
        self._turn = 0
        # client -> seconds of whole-job work it has had, on a clock that starts a newcomer (or a client
        # back after a while) at `_bulk_clock`, the rank of the last client served: no client banks time
        self._bulk_used: dict[str, float] = {}
        self._bulk_clock = 0.0
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
        wholes: list[AnyJob] = []
        for job in self.fair_order():
            if job.kind in left:
                if left[job.kind] > 0:
                    left[job.kind] -= 1
                    admitted.append(job)
            elif whole_too:
                wholes.append(job)
        # the whole job of the client that has had the least whole-job time (ties: fair order), so a
        # client with long runs gets no more of the worker than one with short ones
        whole = min(wholes, key=lambda job: self._bulk_rank(_client(job)), default=None)
        if whole is not None:
            self._bulk_clock = self._bulk_rank(_client(whole))
        for job in admitted + ([whole] if whole else []):
            self._queue.remove(job)
            self._took(job)
        return admitted, whole

    def take_beside(self, running: AnyJob, batched: Collection[str]) -> AnyJob | None:
        """Within the whole job `running`, between its units: the waiting whole job to run beside it, if any
        -> the one of another client and another kind (its executor is busy) whose client has had less
        whole-job time than `running`'s (least first; ties: fair order), taken out of the queue."""
        ahead = self._bulk_rank(_client(running))
        wholes = [job for job in self.fair_order() if job.kind not in batched and job.kind != running.kind
                  and _client(job) != _client(running) and self._bulk_rank(_client(job)) < ahead]
        beside = min(wholes, key=lambda job: self._bulk_rank(_client(job)), default=None)
        if beside is not None:
            self._queue.remove(beside)
            self._took(beside)
        return beside

    def charge(self, job: AnyJob, seconds: float) -> None:
        """A whole job held the worker this long (its own work, not the replies' steps within it)."""
        client = _client(job)
        self._bulk_used[client] = self._bulk_rank(client) + seconds

    def _bulk_rank(self, client: str) -> float:
        return max(self._bulk_used.get(client, 0.0), self._bulk_clock)

    def fair_order(self) -> list[AnyJob]:
        """The waiting jobs in the order they will be taken: round-robin across clients (by address, else
        by owner), each client's own jobs oldest first; the client served longest ago goes first (then
        the one whose oldest job is oldest). So one client's burst cannot push another client's first
        job behind all of it."""
        by_client: dict[str, collections.deque[AnyJob]] = {}
        for job in self._queue:
            by_client.setdefault(_client(job), collections.deque()).append(job)
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
        self._turns[_client(job)] = self._turn
        if len(self._turns) > 4096:  # bounded: forget clients with nothing waiting (they rank as new)
            waiting = {_client(j) for j in self._queue}
            self._turns = {c: t for c, t in self._turns.items() if c in waiting}
        if len(self._bulk_used) > 4096:  # a forgotten client starts again at the clock: no time banked
            self._bulk_used = {c: t for c, t in self._bulk_used.items() if t > self._bulk_clock}


def _client(job: AnyJob) -> str:
    """Who a job counts against: its address, else its owner (a browser, an API key)."""
    return job.client or job.owner


__all__ = ["BulkShare", "Newcomer", "PrefillPass", "Scheduler", "prefill_pass"]
