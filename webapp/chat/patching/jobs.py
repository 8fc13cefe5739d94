"""Activation patching between two prompts, on the core's worker (webapp/chat/patching/compute.py does the
torch work).

A patching job is a whole job (`PatchingJobs`), run between two batched steps like an Inside job: it
lets running replies step after every block it runs (core.interleave) and publishes its cells a batch at
a time, so a page fills in while it runs. It reads the model and writes nothing of it, nor any KV cache:
its runs keep their keys and values to themselves, and running replies stay bit for bit the same.

Events: "estimate" (the whole map to first order, webapp/chat/patching/estimate.py: the clean run, the
corrupted one with gradients, a backward pass), "metrics" (PatchingMetrics: the clean and corrupted values,
once the exact corrupted run has run), then "cells" (a model.patching.Cells per batch), the batches with the
largest estimates first. The finished map, carrying its estimate, is the job's result; a request for the
estimate alone ends with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.decode.reply_jobs import ReplyJobs, kept_prefix
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.patching.compute import BATCH_TOKENS, Patching, barely_moved, edited_from, plan, trace
from webapp.chat.patching.estimate import estimate
from webapp.core.executors import Worker
from webapp.core.jobs import Job


@dataclass(frozen=True)
class PatchingRequest:
    """Token `index` of a reply: its own context (clean) and the same with the last user message edited
    (corrupted), of equal length; the metric is logit(chosen) - logit(against) at the last position."""

    clean_ids: tuple[int, ...]
    corrupted_ids: tuple[int, ...]
    chosen: int
    against: int
    index: int
    estimate: bool = False  # the first-order estimate alone (no exact cells)


@dataclass(frozen=True)
class PatchingMetrics:
    clean: float
    corrupted: float
    first: int  # the first position where the contexts differ

    @property
    def barely_moved(self) -> bool:
        return barely_moved(self.clean, self.corrupted)


@dataclass
class PatchingResult:
    patching: Patching | None = None  # filled in as the cells arrive; complete once the job is done
    reused_positions: int = 0  # the clean run's first positions, whose keys and values a kept KV cache held


class PatchingJobs(ReplyJobs[PatchingRequest, PatchingResult]):
    """The core's executor for patching jobs (it reads no kept cache): the map fills in as batches of cells
    finish, each published as an event."""

    def __init__(self, loaded: LoadedChatModel, prefix: PrefixCache | None = None,
                 batch_tokens: int = BATCH_TOKENS) -> None:
        super().__init__(loaded, prefix)
        self.batch_tokens = batch_tokens

    def work(self, request: PatchingRequest, between: Callable[[], None],
             job: Job[PatchingRequest, PatchingResult], core: Worker) -> PatchingResult:
        model = self.loaded.model
        # the clean run needs its activations from the first edited position on: before it, a kept reply's
        # KV cache serves (as Inside's does), where one holds the context
        kept = kept_prefix(model, request.clean_ids, self.prefix, edited_from(request.clean_ids, request.corrupted_ids))
        with torch.inference_mode():
            clean = trace(model, kept.ids, request.chosen, request.against, kept.start, between=kept.between(between),
                          kept=kept.past)
        guess = estimate(model, request.clean_ids, request.corrupted_ids, request.chosen, request.against, clean,
                         between)
        if request.estimate:
            return PatchingResult(guess, kept.start)
        patching = guess.to_come()
        # partial: readers see the estimate, then the cells so far
        result = job.result = PatchingResult(patching, kept.start)
        job.emit("estimate", guess)
        with torch.inference_mode():
            work = plan(model, request.clean_ids, request.corrupted_ids, request.chosen, request.against, between,
                        self.batch_tokens, clean)
            patching.corrupted = work.corrupted.metric  # the exact run's (the estimate's own differs by rounding)
            job.emit("metrics", PatchingMetrics(work.clean.metric, work.corrupted.metric, work.first))
            for cells in work.batches(first_by=guess):
                patching.fill(cells)
                job.emit("cells", cells)
                core.count("patching_cells", len(cells.indices), job)
        return result
