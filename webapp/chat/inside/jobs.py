"""Inside one generated token, on the core's worker: the logit lens and every head's attention at the
position that produced it (webapp/chat/inside/compute.py does the torch work).

An Inside job is a whole job (`InsideJobs`), run between two batched steps like a Loop-lab run, and it
lets running replies step between its blocks (core.interleave). It reads the model and, when one is
kept, a finished reply's KV cache, and writes neither: running replies stay bit for bit the same.

Where the conversation's kept KV cache (webapp/chat/decode/prefix_cache.py) already holds the context's
first positions, their keys and values are copied from it and only the rest is run; otherwise the whole
context is run through the model's plain forward, block by block.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.decode.reply_jobs import ReplyJobs, kept_prefix
from webapp.chat.inside.compute import Inside, lens_logits, look_inside
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.model.steer import ClampTerm, Term, steer_edit_of
from webapp.core.executors import Worker
from webapp.core.jobs import Job

LENS_TOP = 5  # tokens shown per layer
STRIP_CELLS = 48  # a head's heat strip sums the weights of neighbouring positions beyond this many


@dataclass(frozen=True)
class InsideRequest:
    """Token `index` of a reply: the ids at positions 0..p (prompt, then the reply's tokens before it),
    and the token the output at p produced."""

    context_ids: tuple[int, ...]
    token: int
    index: int
    steer: tuple[Term | ClampTerm, ...] = ()  # a steered version's directions: its run is read with them added


@dataclass(frozen=True)
class LensRow:
    layer: int  # 0: the embeddings; l: after block l
    top: tuple[tuple[int, float], ...]  # (id, probability), most likely first
    chosen_probability: float
    chosen_rank: int  # 1: the layer's most likely token


@dataclass
class InsideReport:
    """What the Inside view and its JSON show; attention stays a tensor (a 254M model's is 256 rows of p+1)."""

    request: InsideRequest
    lens: list[LensRow]
    attention: torch.Tensor  # (n_layer, nh, p + 1) float32 on the CPU; each row sums to 1
    strips: list[list[list[float]]]  # [layer][head][cell]: the weight of each run of positions (STRIP_CELLS)
    strongest: list[list[tuple[int, float]]]  # [layer][head]: the position given most weight, and that weight
    reused_positions: int = 0  # positions whose keys and values came from a kept KV cache

    @property
    def settled_layer(self) -> int | None:
        """The first layer from which the chosen token is the most likely one and stays so (None: never)."""
        settled = None
        for row in self.lens:
            if row.chosen_rank == 1:
                settled = row.layer if settled is None else settled
            else:
                settled = None
        return settled


@dataclass
class InsideResult:
    report: InsideReport | None = None


def lens_rows(logits: torch.Tensor, chosen: int, top: int = LENS_TOP) -> list[LensRow]:
    """logits (L, V) -> one row per layer: softmax at temperature 1 over the whole vocabulary (as the token
    panel's odds: webapp/chat/decode/odds.py), the top tokens, the chosen token's probability and rank."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)  # (L, V)
    top_p, top_ids = probs.topk(min(top, logits.size(-1)), dim=-1)  # (L, top)
    chosen_logit = logits[:, chosen:chosen + 1]  # (L, 1)
    ranks = ((logits > chosen_logit).sum(-1) + 1).tolist()  # ranked as odds.py ranks: strictly greater logits
    chosen_p = probs[:, chosen].tolist()
    return [LensRow(layer, tuple(zip(ids, ps)), cp, rank)
            for layer, (ids, ps, cp, rank) in enumerate(zip(top_ids.tolist(), top_p.tolist(), chosen_p, ranks))]


def inside_report(loaded: LoadedChatModel, request: InsideRequest, between: Callable[[], None] | None = None,
                  prefix: PrefixCache | None = None) -> InsideReport:
    """Run the model over the request's context (reusing the first positions of a KV cache kept in `prefix`)
    -> the report."""
    model = loaded.model
    with torch.inference_mode():
        inside, reused = read_inside(loaded, request.context_ids, request.steer, between, prefix)
        logits = lens_logits(model, inside.residuals)  # (n_layer + 1, V)
        rows = lens_rows(logits, request.token)
        attention = inside.attention.float().cpu()
        # summed here, on the worker: torch work on a request thread would give it a thread pool of its own
        strips = strip_weights(attention, STRIP_CELLS)
        top_weight, top = attention.max(dim=-1)  # (n_layer, nh)
        strongest = [list(zip(p, w)) for p, w in zip(top.tolist(), top_weight.tolist())]
    return InsideReport(request, rows, attention, strips, strongest, reused)


def read_inside(loaded: LoadedChatModel, context_ids: tuple[int, ...], steer: tuple[Term | ClampTerm, ...],
                between: Callable[[], None] | None, prefix: PrefixCache | None) -> tuple[Inside, int]:
    """Inside the last position of a context, as the version that wrote it ran (its steering added), reusing a
    kept KV cache's first positions -> (what is inside, the positions reused). Under inference mode."""
    model = loaded.model
    edit = steer_edit_of(loaded, steer)
    kept = kept_prefix(model, context_ids, prefix if edit is None else None)  # a steered run's keys are its own
    inside = look_inside(model, kept.tokens(next(model.parameters()).device), kept.start, kept.past,
                         kept.between(between), edit)
    return inside, kept.start


def strip_weights(attention: torch.Tensor, cells: int) -> list[list[list[float]]]:
    """(n_layer, nh, S) -> [layer][head][cell]: the weights of min(S, cells) runs of neighbouring positions."""
    positions = attention.size(-1)
    cells = min(positions, cells)
    ends = [(c + 1) * positions // cells - 1 for c in range(cells)]  # each run's last position
    summed = torch.cumsum(attention.double(), dim=-1)[..., ends]  # weight up to each run's end
    return torch.diff(summed, dim=-1, prepend=torch.zeros_like(summed[..., :1])).tolist()


class InsideJobs(ReplyJobs[InsideRequest, InsideResult]):
    """The core's executor for Inside jobs."""

    def work(self, request: InsideRequest, between: Callable[[], None], job: Job[InsideRequest, InsideResult],
             core: Worker) -> InsideResult:
        return InsideResult(inside_report(self.loaded, request, between, self.prefix))
