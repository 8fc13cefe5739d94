"""What every glass-box experiment on a reply shares on the core's worker: its executor (a whole job at a
time, between batched steps, letting running replies step between its units) and its start from a finished
reply's kept KV cache.

An experiment's executor is a `ReplyJobs` that says what one job computes (`work`); the run around it
(cancellation, the units' hook, the model's intra-op threads, the result) is written here once:

    class InsideJobs(ReplyJobs[InsideRequest, InsideResult]):
        def work(self, request, between):
            return InsideResult(inside_report(self.loaded, request, between, self.prefix))

A job that reads a kept cache (`KeptRun`) runs only the positions after it. It never writes one: running
replies stay bit for bit the same.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.model.hooked import KeysValues
from webapp.chat.model.loading import LoadedChatModel
from webapp.core.executors import WholeJobs, Worker, between_units
from webapp.core.jobs import Job, RequestT, ResultT
from webapp.core.threads import torch_threads

# Up to this many positions left to run after a kept cache's (the latest reply's tokens: one), the job
# reads that cache in place and runs whole, about as long as a decoding step; more, and it copies them.
IN_PLACE_RUN = 8


class ReplyJobs(WholeJobs[RequestT, ResultT]):
    """The core's executor for one experiment's jobs on one local chat model: one at a time, between batched
    steps. prefix: the chat replies' kept caches (built at boot), read only; None where the model keeps none."""

    def __init__(self, loaded: LoadedChatModel, prefix: PrefixCache | None = None) -> None:
        self.loaded, self.prefix = loaded, prefix

    def run(self, job: Job[RequestT, ResultT], core: Worker) -> None:
        job.raise_if_cancelled()
        between = between_units(job, core)
        with torch_threads(self.loaded.torch_threads):
            job.result = self.work(job.request, between, job, core)

    @abstractmethod
    def work(self, request: RequestT, between: Callable[[], None], job: Job[RequestT, ResultT],
             core: Worker) -> ResultT:
        """One job's result; call between() after each unit of work (a block, a batch of cells)."""


@dataclass
class KeptRun:
    """Where a run over a context starts: positions 0..start-1 come from a kept reply's cache (past, per layer),
    the rest is run. copied: past is a copy, so replies may step while it runs."""

    ids: list[int]
    start: int = 0
    past: KeysValues | None = None
    copied: bool = False

    def tokens(self, device: torch.device) -> torch.Tensor:
        """The positions run, (1, T)."""
        return torch.tensor([self.ids[self.start:]], dtype=torch.long, device=device)

    def between(self, between: Callable[[], None] | None) -> Callable[[], None] | None:
        """`between`, unless the run reads a kept cache in place: then nothing may step in between (a reply
        could take that cache and overwrite it)."""
        return between if self.past is None or self.copied else None


def kept_prefix(model: torch.nn.Module, ids: Sequence[int], prefix: PrefixCache | None,
                run_from: int | None = None) -> KeptRun:
    """The context's first positions whose keys and values a kept reply's cache holds; at least the last
    position is run, and every position from `run_from` on. When more than IN_PLACE_RUN positions are left
    to run, the job lets replies step between its blocks, and a reply may take that cache and overwrite
    it: they are copied. Nothing kept for this context: a run of it all."""
    ids = list(ids)
    if prefix is None or not hasattr(model, "new_cache"):
        return KeptRun(ids)
    entry, shared = prefix.peek(ids, model)  # the model's own runs: experiments on a kept cache run it unedited
    start = min(shared, len(ids) - 1, len(ids) if run_from is None else run_from)
    if entry is None or start < 1:
        return KeptRun(ids)
    cache = entry.cache
    copied = len(ids) - start > IN_PLACE_RUN
    past = [(k[:, :, :start], v[:, :, :start]) for k, v in zip(cache.k, cache.v)]
    if copied:
        past = [(k.clone(), v.clone()) for k, v in past]
    return KeptRun(ids, start, past, copied)
