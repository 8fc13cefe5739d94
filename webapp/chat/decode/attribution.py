"""Who pushed this token, on the core's worker: direct logit attribution at the position that produced a
token of a reply (webapp/chat/model/attribution.py does the arithmetic).

An attribution job is a whole job (`AttributionJobs`), run between two batched steps as an Inside job is,
and it runs the same forward (webapp/chat/model/inside.look_inside) the same way: running replies step
between its blocks, and where a finished reply's kept KV cache already holds the context's first
positions their keys and values are read from it (copied when more than a few positions are left to run),
never written. The run is the model's own, unedited, so nothing it could leave in a cache is edited.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.decode.reply_jobs import ReplyJobs, kept_prefix
from webapp.chat.model.attribution import Attribution, attribute
from webapp.chat.model.inside import look_inside
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.model.steering import ClampTerm, Term, steer_edit_of
from webapp.core.executors import Worker
from webapp.core.jobs import Job


@dataclass(frozen=True)
class AttributionRequest:
    """Token `index` of a reply, produced from the ids at positions 0..p: its logit (minus that of
    `against`, when given) split by part."""

    context_ids: tuple[int, ...]
    token: int
    index: int
    against: int | None = None
    steer: tuple[Term | ClampTerm, ...] = ()  # a steered version's directions: its run is read with them added


@dataclass
class AttributionReport:
    request: AttributionRequest
    attribution: Attribution
    reused_positions: int = 0  # positions whose keys and values came from a kept KV cache


@dataclass
class AttributionResult:
    report: AttributionReport | None = None


def attribution_report(loaded: LoadedChatModel, request: AttributionRequest,
                       between: Callable[[], None] | None = None,
                       prefix: PrefixCache | None = None) -> AttributionReport:
    """Run the model over the request's context (reusing a kept KV cache's first positions) -> the report."""
    model = loaded.model
    edit = steer_edit_of(loaded, request.steer)
    kept = kept_prefix(model, request.context_ids, prefix if edit is None else None)  # a steered run's keys are its own
    with torch.inference_mode():
        inside = look_inside(model, kept.tokens(next(model.parameters()).device), kept.start, kept.past,
                             kept.between(between), edit)
        attribution = attribute(model, inside, request.token, request.against)
    return AttributionReport(request, attribution, kept.start)


class AttributionJobs(ReplyJobs[AttributionRequest, AttributionResult]):
    """The core's executor for attribution jobs."""

    def work(self, request: AttributionRequest, between: Callable[[], None],
             job: Job[AttributionRequest, AttributionResult], core: Worker) -> AttributionResult:
        return AttributionResult(attribution_report(self.loaded, request, between, self.prefix))
