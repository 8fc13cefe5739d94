"""A reply's token's features, on the shared core: the Inside service's checks and context (the same ids the
model had, the same 404s and 409s), a job per request on the writer's features kind (or the one already queued
or running), finished readings kept, a bounded number, under their request."""

from __future__ import annotations

from typing import Any

from webapp.chat.decode import readings
from webapp.chat.decode.features import FeaturesRequest, FeaturesResult
from webapp.chat.decode.readings import Reading
from webapp.chat.inside import InsideService
from webapp.chat.records import ReplyDetails
from webapp.chat.registry import Work
from webapp.chat.service import ChatError
from webapp.core import InferenceCore
from webapp.core.jobs import Job
from webapp.core.kept import KeptResults

NO_DICTIONARY = ("This model has no sparse dictionary: train one with `python -m webapp.features train` and "
                 "list it in GLASSBOX_CHAT_DICTIONARIES (docs/features.md).")


class FeatureService:
    """What the feature views call; knows the core and the Inside service, never the device."""

    def __init__(self, core: InferenceCore, inside: InsideService, keep: int = 32) -> None:
        self.core, self.inside, self.models = core, inside, inside.models
        self.kept: KeptResults[FeaturesRequest, FeaturesResult, tuple[Reading, ...]] = KeptResults(
            core, keep, lambda result: result.report)

    def unavailable(self, model: str) -> str | None:
        """Why a token's features cannot be read on that model (None: they can)."""
        if not self.models.get(model).dictionaries:
            return NO_DICTIONARY
        return None

    def request_for(self, model: str, message: dict[str, Any], details: ReplyDetails, index: int) -> FeaturesRequest:
        """Token `index` of a reply. Raises ChatError: 404 (no such token), 409 (not finished, no dictionary)."""
        inside = self.inside.request_for(message, details, index)
        problem = self.unavailable(model)
        if problem is not None:
            raise ChatError(problem, 409)
        return FeaturesRequest(inside.context_ids, inside.index, inside.steer)

    def labels(self, model: str, dictionary: str) -> list[str]:
        found: list[str] = self.models.get(model).dictionaries[dictionary].labels
        return found

    def report(self, model: str, request: FeaturesRequest, details: ReplyDetails | None = None
               ) -> tuple[Reading, ...] | None:
        """The readings, where known without a job: saved with the reply by the decode step that sampled the token
        (by every dictionary loaded now, as it is now), or kept from a job; None: start one."""
        found = self.saved(model, details, request.index) if details is not None else None
        return found if found is not None else self.kept.get(model, request)

    def saved(self, model: str, details: ReplyDetails, index: int) -> tuple[Reading, ...] | None:
        """Token `index`'s readings as saved with its reply, by every dictionary loaded now; None where not."""
        return readings.saved_reading(details.features, index, self.models.get(model).dictionaries)

    def start(self, owner: str, model: str, request: FeaturesRequest) -> Job[FeaturesRequest, FeaturesResult]:
        """The job reading this request's features. Raises Refused (queue full, too many jobs)."""
        return self.kept.start(self.models.job_kind(Work.FEATURES, model), owner, model, request, FeaturesResult())
