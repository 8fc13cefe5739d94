"""The logit lens over a whole reply, on the core's worker (webapp/chat/lens/compute.py does the torch work).

A lens job is a whole job (`LensJobs`), run between two batched steps like an Inside job, letting running
replies step between its blocks and between its chunks of the output layer (core.interleave). It reads the
model and, when one is kept, a finished reply's KV cache (its prompt's keys and values, copied when more
than a few positions are left to run, as Inside's are), and writes neither. A reply written with parts
switched off is read with the same parts off: the same Edit its run had (zeros, or the means over its
exact prompt: webapp/chat/ablation/jobs.py), so the last layer is the reply's own odds; its keys and
values were never kept, so none are read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from webapp.chat.ablation.compute import Parts
from webapp.chat.ablation.jobs import AblationRequest, ablation_result
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.decode.reply_jobs import ReplyJobs, kept_prefix
from webapp.chat.lens.compute import lens_grid, reply_residuals
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.model.steer import ClampTerm, Term, steer_edit_of
from webapp.core.executors import Worker
from webapp.core.jobs import Job


@dataclass(frozen=True)
class LensRequest:
    """A reply's first tokens after its exact prompt, and what its run had switched off (None: nothing).
    Column r is position len(prompt) - 1 + r, the one that produced reply token r."""

    prompt_ids: tuple[int, ...]
    reply_ids: tuple[int, ...]
    parts: Parts | None = None
    steer: tuple[Term | ClampTerm, ...] = ()  # the directions its run added (webapp/chat/steering/compute.py)


@dataclass
class LensReport:
    """Plain lists, [layer][column]: layer 0 the embeddings, layer l after block l."""

    request: LensRequest
    top: list[list[int]]
    top_p: list[list[float]]
    written_p: list[list[float]]
    written_rank: list[list[int]]
    reused_positions: int = 0  # positions whose keys and values came from a kept KV cache


@dataclass
class LensResult:
    report: LensReport | None = None


def lens_report(loaded: LoadedChatModel, request: LensRequest, between: Callable[[], None] | None = None,
                prefix: PrefixCache | None = None) -> LensReport:
    """Run the model over the prompt and the reply (reusing a kept KV cache's first positions for a reply
    written with nothing switched off) -> the report."""
    model: Any = loaded.model  # nanoGPT's layout (checked before the job: InsideService.unavailable)
    edit = None
    if request.parts is not None:  # the reply's own Edit, as its run had it
        edit = ablation_result(loaded, AblationRequest(request.prompt_ids, request.parts), between).edit
    elif request.steer:
        edit = steer_edit_of(loaded, request.steer)
    ids = list(request.prompt_ids) + list(request.reply_ids[:-1])  # the last token produced nothing shown
    first = len(request.prompt_ids) - 1  # the position that produced the reply's first token
    # an edited run's keys and values are its own: never kept, so never read (webapp/chat/decode/generate.py);
    # the residuals from `first` on are needed: they are run
    kept = kept_prefix(model, ids, prefix if edit is None else None, run_from=first)
    with torch.inference_mode():
        residuals = reply_residuals(model, kept.tokens(model.transformer.wte.weight.device), first,
                                    kept.between(between), edit, kept.start, kept.past)  # (L, R, C)
        written = torch.tensor(request.reply_ids, dtype=torch.long)
        grid = lens_grid(model, residuals, written, between)  # the cache is no longer read
    return LensReport(request, grid.top.tolist(), grid.top_p.tolist(), grid.written_p.tolist(),
                      grid.written_rank.tolist(), kept.start)


class LensJobs(ReplyJobs[LensRequest, LensResult]):
    """The core's executor for whole-reply lens jobs."""

    def work(self, request: LensRequest, between: Callable[[], None], job: Job[LensRequest, LensResult],
             core: Worker) -> LensResult:
        return LensResult(lens_report(self.loaded, request, between, self.prefix))
