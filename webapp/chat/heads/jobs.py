"""One head over a whole reply, on the core's worker: its attention matrix, query positions × key positions
(webapp/chat/heads/compute.py does the torch work).

A head job is a whole job (`HeadJobs`), run between two batched steps as an Inside job is, over the same
context as Inside's: running replies step between its blocks, and where a finished reply's kept KV cache
already holds the context's first positions (up to the first query row) their keys and values are read
from it, copied when more than a few positions are left to run, never written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.decode.reply_jobs import ReplyJobs, kept_prefix
from webapp.chat.heads.compute import head_attention
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.model.steer import ClampTerm, Term, steer_edit_of
from webapp.core.executors import Worker
from webapp.core.jobs import Job


@dataclass(frozen=True)
class HeadRequest:
    """Layer `layer`, head `head` (both from 0, as every page counts them): the weights of the query
    positions first..p over positions 0..p, where the ids at 0..p are Inside's context for token `index`."""

    context_ids: tuple[int, ...]
    index: int
    layer: int
    head: int
    first: int
    steer: tuple[Term | ClampTerm, ...] = ()  # a steered version's directions: its run is read with them added


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
    edit = steer_edit_of(loaded, request.steer)
    # the query rows are run, from their residual stream up; a steered run's keys are its own
    kept = kept_prefix(model, request.context_ids, prefix if edit is None else None, run_from=request.first)
    with torch.inference_mode():
        weights = head_attention(model, kept.tokens(next(model.parameters()).device), request.layer, request.head,
                                 request.first, kept.start, kept.past, kept.between(between), edit)
        # made lists here, on the worker: torch work on a request thread would get a thread pool of its own
        rows = weights.cpu().tolist()
    return HeadReport(request, rows, kept.start)


class HeadJobs(ReplyJobs[HeadRequest, HeadResult]):
    """The core's executor for head jobs."""

    def work(self, request: HeadRequest, between: Callable[[], None], job: Job[HeadRequest, HeadResult],
             core: Worker) -> HeadResult:
        return HeadResult(head_report(self.loaded, request, between, self.prefix))
