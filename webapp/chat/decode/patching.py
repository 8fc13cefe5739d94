"""Activation patching between two prompts, on the core's worker (webapp/chat/model/patching.py does the
torch work).

A patching job is a whole job (`PatchingJobs`), run between two batched steps like an Inside job: it
lets running replies step after every block it runs (core.interleave) and publishes its cells a batch at
a time, so a page fills in while it runs. It reads the model and writes nothing of it, nor any KV cache:
its runs keep their keys and values to themselves, and running replies stay bit for bit the same.

Events: "metrics" (PatchingMetrics: the clean and corrupted values, once both contexts have run), then
"cells" (a model.patching.Cells per batch). The finished map is the job's result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.model.patching import BATCH_TOKENS, Patching, plan
from webapp.core.executors import WholeJobs, Worker, between_units
from webapp.core.jobs import Job
from webapp.core.threads import torch_threads


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


class PatchingJobs(WholeJobs[PatchingRequest, PatchingResult]):
    """The core's executor for patching jobs on one local chat model: one at a time, between batched steps."""

    def __init__(self, loaded: LoadedChatModel, batch_tokens: int = BATCH_TOKENS) -> None:
        self.loaded, self.batch_tokens = loaded, batch_tokens

    def run(self, job: Job[PatchingRequest, PatchingResult], core: Worker) -> None:
        job.raise_if_cancelled()

        between = between_units(job, core)
        request = job.request
        with torch_threads(self.loaded.torch_threads), torch.inference_mode():
            work = plan(self.loaded.model, request.clean_ids, request.corrupted_ids, request.chosen,
                        request.against, between, self.batch_tokens)
            result = work.empty()
            job.result = PatchingResult(result)
            job.emit("metrics", PatchingMetrics(work.clean.metric, work.corrupted.metric, work.first))
            for cells in work.batches():
                result.fill(cells)
                job.emit("cells", cells)
                core.count("patching_cells", len(cells.indices), job)
