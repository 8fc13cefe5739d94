"""A job: one unit of device work, its event log, and its subscribers.

A job is created by a service with its request (plain data: what to run), waits in the core's
queue, is run by the core's worker through the executor of its kind, and publishes events.  Any number
of streams may subscribe; each one first replays what was
published so far, so a late or reconnecting subscriber misses nothing and nothing is ever
generated twice.  When the last subscriber leaves an unfinished job, the job is cancelled.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeAlias, TypeVar


class JobState(StrEnum):
    """Where a job is: waiting, running, or finished in one of three ways (its outcome). A StrEnum: the job
    log, the metrics and the stream's events write its value ("done")."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"


QUEUED, RUNNING, DONE, CANCELLED, FAILED = (JobState.QUEUED, JobState.RUNNING, JobState.DONE, JobState.CANCELLED,
                                            JobState.FAILED)
FINISHED = frozenset({DONE, CANCELLED, FAILED})

# The address of the client whose request creates a job (as the trusted proxy reports it). Set by the
# web layer before each request, so the services need not pass it along: the core limits jobs per
# address and takes waiting jobs round-robin across addresses (a script can shed its cookie, not its address).
CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("glassbox_client", default="")

# A running job's partial result is saved (Job.on_progress) after this many pieces or seconds,
# whichever comes first: a kill -9 loses at most that much of what the user saw.
PROGRESS_PIECES = 32
PROGRESS_SECONDS = 1.0


class JobCancelled(Exception):
    """Raised inside a whole job when it was cancelled; the core treats it as a clean stop."""


@dataclass(frozen=True)
class Event:
    """One published event: a name the stream uses as its SSE event name, and its data: a demo's own typed
    payload (a chat reply's TokenEvent, a Loop-lab run's RowsEvent), or a dict of fields (the core's
    `position` and `running`). Readers check the payload's type."""

    name: str
    data: object


RequestT = TypeVar("RequestT")
ResultT = TypeVar("ResultT")


@dataclass
class Job(Generic[RequestT, ResultT]):
    """A job of one kind: its demo's request (plain data: what to run) and result (what it produced),
    e.g. Job[ChatRequest, ChatResult]. The core never reads either: it handles AnyJob."""

    kind: str  # which executor runs it ("chat", "loops")
    owner: str
    # The defaults (no request, a dict for a result) serve jobs whose kind needs neither (the tests' probes).
    request: RequestT = None  # type: ignore[assignment]
    # Called once with (job, outcome, error) before the end is announced: saves results,
    # whatever the outcome (done, cancelled, failed).
    on_finish: Callable[[Job[RequestT, ResultT], JobState, str | None], None] | None = None
    # Called now and then while it runs (Job.progress) with the job: saves the partial result.
    on_progress: Callable[[Job[RequestT, ResultT]], None] | None = None
    # A job nobody ever subscribed to is abandoned after this many seconds.
    orphan_seconds: float = 30.0
    client: str = field(default_factory=CLIENT.get)  # who asked (an address), for per-client limits
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: float = field(default_factory=time.monotonic)
    state: JobState = QUEUED
    position: int = 0  # 1-based place in the queue while waiting; 0 once running
    error: str | None = None
    started: float | None = None
    finished: float | None = None
    # what it produced, of its kind's own type (a chat reply's ChatResult, a Loop-lab run's LoopResult)
    result: ResultT = field(default_factory=dict)  # type: ignore[assignment]
    counts: dict[str, int] = field(default_factory=dict)  # what it produced (tokens, rows), for the job log
    seq: int = 0  # its place in the order of submission (1, 2, ...), for the job log
    ref: Any = None  # what the job is found by besides its id (a chat reply: its message id)
    # Jobs of one group (a Loop-lab sweep's runs) count as one job against the per-owner and per-address
    # limits: the group is one thing its owner asked for, however many runs it steps at once.
    group: str | None = None

    def __post_init__(self) -> None:
        self._events: list[Event] = []
        self._cond = threading.Condition()
        self._version = itertools.count(1)
        self._changed = 0
        self._subscribers = 0
        self._ever_subscribed = False
        self._askers = {self.owner}  # the browsers that asked for it (KeptResults.start joins them to one job)
        self._keep_running = False  # its last subscriber leaving does not cancel it (keep_running)
        self._cancel = threading.Event()
        self._unsaved, self._saved_at = 0, time.monotonic()
        self.save_error: str | None = None  # set when saving its result failed: the job then fails

    def progress(self) -> None:
        """Called by the executor after each piece it publishes: saves the partial result every
        PROGRESS_PIECES pieces or PROGRESS_SECONDS. A failed save (disk full, read-only) stops the job,
        which then ends as failed with the reason (InferenceCore._finish)."""
        if self.on_progress is None or self.save_error is not None:
            return
        self._unsaved += 1
        now = time.monotonic()
        if self._unsaved < PROGRESS_PIECES and now - self._saved_at < PROGRESS_SECONDS:
            return
        self._unsaved, self._saved_at = 0, now
        try:
            self.on_progress(self)
        except Exception as error:
            self.fail_saving(error)

    def fail_saving(self, error: Exception) -> None:
        self.save_error = f"Could not save the result: {error or type(error).__name__}"
        self.cancel()

    # -- producer side (the core's worker) -------------------------------------------------
    def emit(self, name: str, payload: object = None, /, **data: Any) -> None:
        """Publish an event, its data `payload` or else the fields given; raises JobCancelled once the job
        was cancelled."""
        self.raise_if_cancelled()
        self.keep(name, payload, **data)

    def keep(self, name: str, payload: object = None, /, **data: Any) -> None:
        """Publish an event even once cancelled: what a stopping job had already worked out."""
        with self._cond:
            self._events.append(Event(name, data if payload is None else payload))
            self._touch()

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise JobCancelled()

    @property
    def cancelled(self) -> bool:
        if self._cancel.is_set():
            return True
        if not self._ever_subscribed and time.monotonic() - self.created > self.orphan_seconds:
            self._cancel.set()  # created, never watched: nobody will ever see the result
            return True
        return False

    def set_position(self, position: int) -> None:
        with self._cond:
            if position != self.position:
                self.position = position
                self._touch()

    def set_state(self, state: JobState, error: str | None = None) -> None:
        with self._cond:
            self.state = state
            if state == RUNNING:
                self.position, self.started = 0, time.monotonic()
            if state in FINISHED:
                self.finished = time.monotonic()
                self.error = error
            self._touch()

    def _touch(self) -> None:
        self._changed = next(self._version)
        self._cond.notify_all()

    # -- consumer side (streams) ------------------------------------------------------------
    def cancel(self) -> None:
        """Ask the job to stop at its next check (a token, a loop); harmless once finished."""
        self._cancel.set()
        with self._cond:
            self._cond.notify_all()

    def ask(self, owner: str) -> None:
        """Another browser asked for what this job works out, and shares it."""
        with self._cond:
            self._askers.add(owner)

    def asked_by(self, owner: str) -> bool:
        with self._cond:
            return owner in self._askers

    def withdraw(self, owner: str) -> bool:
        """A browser no longer wants it (its Stop) -> whether nobody else does either: then the caller cancels
        it. One browser's Stop never takes the result from another that asked for the same."""
        with self._cond:
            self._askers.discard(owner)
            return not self._askers

    def keep_running(self) -> None:
        """Its last subscriber leaving no longer cancels it: a request that stopped waiting for it (too long)
        leaves it to finish, so that asking again finds it running, or its kept result."""
        with self._cond:
            self._keep_running = True

    def watched_elsewhere(self) -> None:
        """Someone follows it from outside this process (another front end reading its saved result), so
        it is not an orphan, though nobody here ever subscribed."""
        with self._cond:
            self._ever_subscribed = True

    @property
    def finished_state(self) -> bool:
        return self.state in FINISHED

    @property
    def events(self) -> list[Event]:
        with self._cond:
            return list(self._events)

    def subscribe(self, heartbeat: float = 1.0) -> Generator[Event | None, None, None]:
        """Replay the log, then follow it live until the job finishes.

        Yields Event objects, synthetic ``position`` events while queued and one ``running``
        event when the job starts, and None every
        ``heartbeat`` seconds of silence (the caller writes a keep-alive, which is also how a
        vanished client is noticed).  Closing the iterator unsubscribes; the last subscriber
        leaving an unfinished job cancels it.
        """
        batches = self.subscribe_batches(heartbeat)
        try:
            for batch in batches:
                if batch is None:
                    yield None
                else:
                    yield from batch
        finally:
            batches.close()

    def subscribe_batches(self, heartbeat: float = 1.0, *,
                          watch: bool = False) -> Generator[list[Event] | None, None, None]:
        """subscribe(), the events that came together in one list: everything new since the subscriber
        last looked (a replay's whole log, the tokens of a step it was too slow for), so a stream can
        write them at once. None every ``heartbeat`` seconds of silence. `watch`: a follower of someone
        else's job (a follow link), which neither keeps it alive nor cancels it by leaving."""
        with self._cond:
            if not watch:
                self._subscribers += 1
                self._ever_subscribed = True
        sent, seen, last_position, announced_running = 0, -1, None, False
        try:
            while True:
                with self._cond:
                    if self._changed == seen and not self.finished_state:
                        self._cond.wait(heartbeat)
                    timed_out = self._changed == seen and not self.finished_state
                    seen = self._changed
                    fresh = self._events[sent:]
                    sent = len(self._events)
                    position, state = self.position, self.state
                if timed_out:
                    yield None
                    continue
                batch = []
                if state == QUEUED and position != last_position:
                    last_position = position
                    batch.append(Event("position", {"position": position}))
                if state != QUEUED and not announced_running:
                    announced_running = True
                    batch.append(Event("running", {}))
                batch += fresh
                if batch:
                    yield batch
                if state in FINISHED:
                    return
        finally:
            if not watch:
                with self._cond:
                    self._subscribers -= 1
                    abandoned = self._subscribers == 0 and not self.finished_state and not self._keep_running
                if abandoned:
                    self.cancel()

    @property
    def subscribers(self) -> int:
        with self._cond:
            return self._subscribers


AnyJob: TypeAlias = Job[Any, Any]  # a job as the core sees it: it runs jobs of every kind, reads neither part
