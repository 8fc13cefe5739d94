"""Who pushed this token, on the shared core: the Inside service's checks and context (the same ids the
model had, the same 404s and 409s), a job per request on the writer's attribution kind (or the one already
queued or running), and finished reports kept, a bounded number, least recently used forgotten first,
under their request (context, token, against), never under a message id."""

from __future__ import annotations

from typing import Any

from webapp.chat.attribution.jobs import AttributionReport, AttributionRequest, AttributionResult
from webapp.chat.inside.service import InsideService
from webapp.chat.records import Message, ReplyDetails
from webapp.chat.registry import Work
from webapp.chat.reports import ReportJobs
from webapp.chat.service import ChatError
from webapp.core import InferenceCore


class AttributionService(ReportJobs[AttributionRequest, AttributionResult, AttributionReport]):
    """What the attribution views call; knows the core and the Inside service, never the device."""

    def __init__(self, core: InferenceCore, inside: InsideService, keep: int = 32) -> None:
        super().__init__(core, inside.models, Work.ATTRIBUTION, keep, lambda result: result.report,
                         AttributionResult)
        self.inside = inside

    def request_for(self, model: str, message: Message, details: ReplyDetails, index: int,
                    against: int | None) -> AttributionRequest:
        """Token `index` of a reply, against another token. Raises ChatError: 404 (no such token),
        409 (not finished), 400 (`against` not a token of the model's vocabulary)."""
        inside = self.inside.request_for(message, details, index)
        vocabulary = self.vocabulary(model)
        if against is not None and not 0 <= against < vocabulary:
            raise ChatError(f"against must be a token id from 0 to {vocabulary - 1}; got {against}.", 400)
        return AttributionRequest(inside.context_ids, inside.token, inside.index, against, inside.steer)

    def vocabulary(self, model: str) -> int:
        """How many token ids there are: the tokenizer's (ordinary and special), within the output layer's
        rows (a vocabulary padded to a multiple of 64 has rows that are no token)."""
        loaded = self.models.get(model)
        gpt: Any = loaded.model  # nanoGPT's layout (checked before any request: InsideService.unavailable)
        return min(int(loaded.tokenizer.n_vocab), int(gpt.lm_head.weight.size(0)))
