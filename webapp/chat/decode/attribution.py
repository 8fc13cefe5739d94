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

from webapp.chat.decode.inside import kept_prefix
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.model.attribution import Attribution, attribute
from webapp.chat.model.inside import look_inside
from webapp.chat.model.loading import LoadedChatModel
from webapp.core.executors import WholeJobs, Worker, between_units
from webapp.core.jobs import Job
from webapp.core.threads import torch_threads


@dataclass(frozen=True)
class AttributionRequest:
    """Token `index` of a reply, produced from the ids at positions 0..p: its logit (minus that of
    `against`, when given) split by part."""

    context_ids: tuple[int, ...]
    token: int
    index: int
    against: int | None = None


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
    ids = list(request.context_ids)
    device = next(model.parameters()).device
    start, past, copied = kept_prefix(model, ids, prefix)
    with torch.inference_mode():
        run = torch.tensor([ids[start:]], dtype=torch.long, device=device)  # (1, T)
        # reading a kept cache in place, nothing may step in between (a reply could take that cache)
        inside = look_inside(model, run, start, past, between if past is None or copied else None)
        attribution = attribute(model, inside, request.token, request.against)
    return AttributionReport(request, attribution, start)


class AttributionJobs(WholeJobs[AttributionRequest, AttributionResult]):
    """The core's executor for attribution jobs: one at a time, between batched steps."""

    def __init__(self, loaded: LoadedChatModel, prefix: PrefixCache | None = None) -> None:
        self.loaded, self.prefix = loaded, prefix  # the chat replies' kept caches (built at boot), read only

    def run(self, job: Job[AttributionRequest, AttributionResult], core: Worker) -> None:
        job.raise_if_cancelled()

        between = between_units(job, core)
        with torch_threads(self.loaded.torch_threads):
            report = attribution_report(self.loaded, job.request, between, self.prefix)
        job.result = AttributionResult(report)
