"""A contrastive steering direction, on the core's worker: the mean difference of the residual stream after a
block between two lists of prompts (webapp/chat/steering/compute.py does the torch work). A whole job between
the replies' batched steps; it lets them step after each prompt's run and reads no kept cache."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from webapp.chat.decode.reply_jobs import ReplyJobs
from webapp.chat.steering.compute import contrastive
from webapp.core.executors import Worker
from webapp.core.jobs import Job


@dataclass(frozen=True)
class DirectionRequest:
    """Block `layer` (0-based), and each side's prompts as the ids the model is given."""

    layer: int
    positive: tuple[tuple[int, ...], ...]
    negative: tuple[tuple[int, ...], ...]
    method: str = "mean"  # or "pca": the first principal component of the paired differences


@dataclass
class DirectionResult:
    vector: list[float] | None = None  # the model's width, float32 values


class DirectionJobs(ReplyJobs[DirectionRequest, DirectionResult]):
    """The core's executor for contrastive directions."""

    def work(self, request: DirectionRequest, between: Callable[[], None],
             job: Job[DirectionRequest, DirectionResult], core: Worker) -> DirectionResult:
        vector = contrastive(self.loaded.model, request.positive, request.negative, request.layer, between,
                             request.method)
        return DirectionResult(vector.tolist())
