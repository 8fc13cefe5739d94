"""One head over a whole reply, on the core's worker: its attention matrix, query positions × key positions
(webapp/chat/model/head_attention.py does the torch work).

A head job is a whole job (`HeadJobs`), run between two batched steps as an Inside job is, over the same
context as Inside's: running replies step between its blocks, and where a finished reply's kept KV cache
already holds the context's first positions (up to the first query row) their keys and values are read
from it, copied when more than a few positions are left to run, never written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from webapp.chat.decode.inside import IN_PLACE_RUN, kept_prefix
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.model.head_attention import head_attention
from webapp.chat.model.loading import LoadedChatModel
from webapp.core.executors import WholeJobs, Worker, between_units
from webapp.core.jobs import Job
from webapp.core.threads import torch_threads


@dataclass(frozen=True)
class HeadRequest:
    """Block `layer`, head `head` (both from 0, as every page counts them): the weights of the query
    positions first..p over positions 0..p, where the ids at 0..p are Inside's context for token `index`."""

    context_ids: tuple[int, ...]
    index: int
    layer: int
    head: int
    first: int


@dataclass
class HeadReport:
    request: HeadRequest
    weights: list[list[float]]  # [row][key]: query first + row over keys 0..p; zero after the query
    reused_positions: int = 0  # positions whose keys and values came from a kept KV cache


@dataclass
class HeadResult:
    report: HeadReport | None = None


def head_report(loaded: LoadedChatModel, request: HeadRequest, between: Callable[[], None] | None = None,
                prefix: PrefixCache | None = None) -> HeadReport:
    """Run the model over the request's context to the chosen block (reusing a kept KV cache's positions
    before the first query row) -> the report."""
    model = loaded.model
    ids = list(request.context_ids)
    device = next(model.parameters()).device
    start, past, copied = kept_prefix(model, ids, prefix)
    if start > request.first:  # the query rows are run, from their residual stream up
        start = request.first
        past = None if start == 0 else [(k[:, :, :start], v[:, :, :start]) for k, v in past or []]
        if past is not None and not copied and len(ids) - start > IN_PLACE_RUN:
            past, copied = [(k.clone(), v.clone()) for k, v in past], True
    with torch.inference_mode():
        run = torch.tensor([ids[start:]], dtype=torch.long, device=device)  # (1, T)
        # reading a kept cache in place, nothing may step in between (a reply could take that cache)
        weights = head_attention(model, run, request.layer, request.head, request.first, start, past,
                                 between if past is None or copied else None)
        # made lists here, on the worker: torch work on a request thread would get a thread pool of its own
        rows = weights.cpu().tolist()
    return HeadReport(request, rows, start)


class HeadJobs(WholeJobs[HeadRequest, HeadResult]):
    """The core's executor for head jobs: one at a time, between batched steps."""

    def __init__(self, loaded: LoadedChatModel, prefix: PrefixCache | None = None) -> None:
        self.loaded, self.prefix = loaded, prefix  # the chat replies' kept caches (built at boot), read only

    def run(self, job: Job[HeadRequest, HeadResult], core: Worker) -> None:
        job.raise_if_cancelled()
        between = between_units(job, core)
        with torch_threads(self.loaded.torch_threads):
            report = head_report(self.loaded, job.request, between, self.prefix)
        job.result = HeadResult(report)
