"""Who pushed this token, on the core's worker: direct logit attribution at the position that produced a
token of a reply (webapp/chat/attribution/compute.py does the arithmetic).

An attribution job is a whole job (`AttributionJobs`), run between two batched steps as an Inside job is,
and it runs the same forward (webapp/chat/inside/compute.look_inside) the same way: running replies step
between its blocks, and where a finished reply's kept KV cache already holds the context's first
positions their keys and values are read from it (copied when more than a few positions are left to run),
never written. The run is the model's own, unedited, so nothing it could leave in a cache is edited.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from webapp.chat.attribution.compute import Attribution, attribute
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.decode.reply_jobs import ReplyJobs
from webapp.chat.inside.jobs import read_inside
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.model.steer import ClampTerm, Term
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
    with torch.inference_mode():
        inside, reused = read_inside(loaded, request.context_ids, request.steer, between, prefix)
        attribution = attribute(loaded.model, inside, request.token, request.against)
    return AttributionReport(request, attribution, reused)


class AttributionJobs(ReplyJobs[AttributionRequest, AttributionResult]):
    """The core's executor for attribution jobs."""

    def work(self, request: AttributionRequest, between: Callable[[], None],
             job: Job[AttributionRequest, AttributionResult], core: Worker) -> AttributionResult:
        return AttributionResult(attribution_report(self.loaded, request, between, self.prefix))
