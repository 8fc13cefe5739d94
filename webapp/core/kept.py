"""Results of whole jobs kept by request, and the job that works one out.

Inside reports, attributions, a mean ablation's means and patching maps are each worked out by a whole job
on the core, and each is kept under its request, least recently used forgotten first: asking again is
answered at once, and a request already queued or running is joined, never run twice. A result is kept
under (the model, the request), not under a message id: what it shows depends on nothing else, and a
deleted message's id cannot lead to another's result."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from webapp.core.engine import InferenceCore
from webapp.core.jobs import DONE, FINISHED, Job, JobState, RequestT, ResultT

Kept = TypeVar("Kept")
Built = TypeVar("Built")
Key = tuple[str, Hashable]  # (the model's registry name, the request)


class KeptResults(Generic[RequestT, ResultT, Kept]):
    """What finished jobs of one kind of work found (`found(job.result)`, None: nothing to keep), at most
    `keep` of them, and what views made of each (made_of), forgotten with it."""

    def __init__(self, core: InferenceCore, keep: int, found: Callable[[ResultT], Kept | None]) -> None:
        self.core, self.keep, self._found = core, keep, found
        self._kept: collections.OrderedDict[Key, Kept] = collections.OrderedDict()
        self._made: dict[Key, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def get(self, model: str, request: RequestT) -> Kept | None:
        """The kept result for this request on that model, if it was worked out before."""
        with self._lock:
            found = self._kept.get((model, request))
            if found is not None:
                self._kept.move_to_end((model, request))
            return found

    def __contains__(self, key: Key) -> bool:
        with self._lock:
            return key in self._kept

    def made_of(self, model: str, request: RequestT, what: str, make: Callable[[], Built]) -> Built:
        """What a view makes of a kept result (its JSON as bytes, a page's table), made once and kept with the
        result, forgotten with it. A result not kept (keep 0, or already forgotten) makes it each time."""
        key = (model, request)
        with self._lock:
            found: Built | None = self._made.get(key, {}).get(what)
        if found is not None:
            return found
        made = make()
        with self._lock:
            if key in self._kept:
                self._made.setdefault(key, {})[what] = made
        return made

    def clear(self) -> None:
        with self._lock:
            keys = list(self._kept)
            self._kept.clear()
        for key in keys:
            self._forgot(key)

    def start(self, kind: str, owner: str, model: str, request: RequestT,
              result: ResultT) -> Job[RequestT, ResultT]:
        """The job working this request out on that model (`kind`): the one already queued or running,
        else a new one (`result`: its empty result). Raises Refused (queue full, too many jobs for this
        browser or address)."""
        running = self.core.find(kind, request)
        if running is not None and running.state not in FINISHED:
            running.ask(owner)  # shared: its Stop is each asker's own (Job.withdraw)
            return running

        def keep(job: Job[RequestT, ResultT], outcome: JobState, error: str | None) -> None:
            found = self._found(job.result) if outcome == DONE else None
            if found is not None:
                self._remember((model, request), found)

        return self.core.submit(Job(kind, owner, request, on_finish=keep, ref=request, result=result))

    def _remember(self, key: Key, kept: Kept) -> None:
        forgotten = [key]  # what was made of the result this one replaces goes too
        with self._lock:
            self._kept[key] = kept
            self._kept.move_to_end(key)
            while len(self._kept) > self.keep:
                forgotten.append(self._kept.popitem(last=False)[0])
        for old in forgotten:
            self._forgot(old)

    def _forgot(self, key: Key) -> None:
        with self._lock:
            self._made.pop(key, None)


__all__ = ["KeptResults"]
