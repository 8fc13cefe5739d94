"""Chat replies on the core's worker, one whole reply at a time: the executor for the owner's models
without a KV cache (the seed's full-recompute loop), as before batching."""

from __future__ import annotations

from contextlib import closing

from webapp.chat.decode.generate import generate
from webapp.chat.decode.publish import chat_result, publish
from webapp.chat.decode.types import ChatJob, ChatRequest, ChatResult
from webapp.chat.model.loading import LoadedChatModel
from webapp.core.executors import WholeJobs, Worker
from webapp.core.jobs import JobCancelled
from webapp.core.threads import torch_threads


class ChatAlone(WholeJobs[ChatRequest, ChatResult]):
    """The whole-reply executor, for models without a KV cache: one reply at a time."""

    def __init__(self, loaded: LoadedChatModel) -> None:
        self.loaded = loaded

    def run(self, job: ChatJob, core: Worker) -> None:
        request = job.request
        chat_result(job)
        p = request.params
        pieces = generate(self.loaded, request.prompt_ids, max_new_tokens=p.max_new_tokens,
                          temperature=p.temperature, top_k=p.top_k, seed=p.seed,
                          should_stop=lambda: job.cancelled, odds=request.odds,
                          forced=request.forced, forced_odds=request.forced_odds, edit=request.edit,
                          features=request.features)
        with torch_threads(self.loaded.torch_threads), closing(pieces):
            for piece in pieces:
                publish(job, piece, core)
        if job.cancelled:  # the generator stopped early: say so
            raise JobCancelled()
