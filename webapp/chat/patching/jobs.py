"""Activation patching between two prompts, on the core's worker (webapp/chat/patching/compute.py does the
torch work).

A patching job is a whole job (`PatchingJobs`), run between two batched steps like an Inside job: it
lets running replies step after every block it runs (core.interleave) and publishes its cells a batch at
a time, so a page fills in while it runs. It reads the model and writes nothing of it, nor any KV cache:
its runs keep their keys and values to themselves, and running replies stay bit for bit the same.

Events: "metrics" (PatchingMetrics: the clean and corrupted values, once both contexts have run), then
"cells" (a model.patching.Cells per batch). The finished map is the job's result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.decode.reply_jobs import ReplyJobs
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.patching.compute import BATCH_TOKENS, Patching, plan
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


@dataclass(frozen=True)
class PatchingMetrics:
    clean: float
    corrupted: float
    first: int  # the first position where the contexts differ


@dataclass
class PatchingResult:
    patching: Patching | None = None  # filled in as the cells arrive; complete once the job is done


class PatchingJobs(ReplyJobs[PatchingRequest, PatchingResult]):
    """The core's executor for patching jobs (it reads no kept cache): the map fills in as batches of cells
    finish, each published as an event."""

    def __init__(self, loaded: LoadedChatModel, prefix: PrefixCache | None = None,
                 batch_tokens: int = BATCH_TOKENS) -> None:
        super().__init__(loaded, prefix)
        self.batch_tokens = batch_tokens

    def work(self, request: PatchingRequest, between: Callable[[], None],
             job: Job[PatchingRequest, PatchingResult], core: Worker) -> PatchingResult:
        with torch.inference_mode():
            work = plan(self.loaded.model, request.clean_ids, request.corrupted_ids, request.chosen,
                        request.against, between, self.batch_tokens)
            patching = work.empty()
            result = job.result = PatchingResult(patching)  # partial: readers see the cells so far
            job.emit("metrics", PatchingMetrics(work.clean.metric, work.corrupted.metric, work.first))
            for cells in work.batches():
                patching.fill(cells)
                job.emit("cells", cells)
                core.count("patching_cells", len(cells.indices), job)
        return result
