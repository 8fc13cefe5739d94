"""What every experiment's service on a reply shares, written once: a job per request on the kind of this
experiment for the reply's model (the one already queued or running, else a new one), and its finished reports
kept, a bounded number (GLASSBOX_INSIDE_CACHE_ENTRIES), under their request (webapp/core/kept.py)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from webapp.chat.registry import ChatModels, Work
from webapp.core import InferenceCore
from webapp.core.jobs import Job
from webapp.core.kept import KeptResults

RequestT = TypeVar("RequestT", bound=Hashable)
ResultT = TypeVar("ResultT")
Kept = TypeVar("Kept")
Built = TypeVar("Built")


class ReportJobs(Generic[RequestT, ResultT, Kept]):
    """An experiment's jobs and kept reports. `found`: the report in a finished job's result (None: nothing to
    keep); `new_result`: an empty result for a new job."""

    def __init__(self, core: InferenceCore, models: ChatModels, work: Work, keep: int,
                 found: Callable[[ResultT], Kept | None], new_result: Callable[[], ResultT]) -> None:
        self.core, self.models, self.work = core, models, work
        self.kept: KeptResults[RequestT, ResultT, Kept] = KeptResults(core, keep, found)
        self.found, self._new_result = found, new_result

    def kind(self, model: str) -> str:
        """This experiment's job kind on that model (ChatModels.job_kind)."""
        return self.models.job_kind(self.work, model)

    def report(self, model: str, request: RequestT) -> Kept | None:
        """The kept report for this request on that model, if it was worked out before."""
        return self.kept.get(model, request)

    def made_of(self, model: str, request: RequestT, what: str, make: Callable[[], Built]) -> Built:
        """What a view makes of a kept report, made once and kept with it (KeptResults.made_of)."""
        return self.kept.made_of(model, request, what, make)

    def job(self, model: str, request: RequestT) -> Job[RequestT, ResultT] | None:
        """The newest job for this request on that model, running or finished (None: none)."""
        found: Job[RequestT, ResultT] | None = self.core.find(self.kind(model), request)
        return found

    def start(self, owner: str, model: str, request: RequestT) -> Job[RequestT, ResultT]:
        """The job working this request out on that model: the one already queued or running, else a new
        one. Raises Refused (queue full, too many jobs for this browser or address)."""
        return self.kept.start(self.kind(model), owner, model, request, self._new_result())
