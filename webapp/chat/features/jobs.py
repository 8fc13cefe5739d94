"""The features active at one token of a reply, on the core's worker: the residual stream at the position that
produced it (as Inside reads it: a kept KV cache's positions reused, the rest run through the hooked forward up
to the last block a dictionary reads), encoded by each of the model's dictionaries
(webapp/chat/features/dictionaries.py). And the features of every token of a text someone types (a search:
"which features fire on ' Paris'?"), read at each token's own position after the start token, as a corpus is
read for the top contexts (webapp/chat/features/contexts.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from webapp.chat.decode import readings
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.decode.readings import Reading
from webapp.chat.decode.reply_jobs import ReplyJobs, kept_prefix
from webapp.chat.model import hooked
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.model.steer import ClampTerm, Term, steer_edit_of
from webapp.core.executors import Worker
from webapp.core.jobs import Job


@dataclass(frozen=True)
class FeaturesRequest:
    """Token `index` of a reply: the ids at positions 0..p, as Inside's request has them."""

    context_ids: tuple[int, ...]
    index: int
    steer: tuple[Term | ClampTerm, ...] = ()  # a steered version's directions: its run is read with them added


@dataclass
class FeaturesResult:
    report: tuple[Reading, ...] | None = None


def features_report(loaded: LoadedChatModel, request: FeaturesRequest, between: Callable[[], None] | None = None,
                    prefix: PrefixCache | None = None) -> tuple[Reading, ...]:
    model = loaded.model
    dictionaries = list((loaded.dictionaries or {}).values())
    edit = steer_edit_of(loaded, request.steer)
    kept = kept_prefix(model, request.context_ids, prefix if edit is None else None)  # a steered run's keys are its own
    last = len(request.context_ids) - 1
    layers = frozenset(block + 1 for block in readings.blocks_read(dictionaries))
    with torch.inference_mode():
        x = hooked.embed(model, kept.tokens(next(model.parameters()).device), kept.start)
        out = hooked.run(model, x, start=kept.start, past=kept.past, last_layer=max(layers) - 1, edits=edit,
                         reads=hooked.Reads(resid=True, first=last, layers=layers), between=kept.between(between))
    found = readings.read(dictionaries, {layer - 1: out.resid[layer][0, -1:] for layer in layers})
    return found[0]


@dataclass(frozen=True)
class TextFeaturesRequest:
    """A text's ids after the start token: ids[0] is the start token, each later token is read at its own place."""

    ids: tuple[int, ...]


@dataclass
class TextFeaturesResult:
    report: tuple[tuple[Reading, ...], ...] | None = None  # per token after the start, one reading per dictionary


def text_features(loaded: LoadedChatModel, request: TextFeaturesRequest,
                  between: Callable[[], None] | None = None) -> tuple[tuple[Reading, ...], ...]:
    """Each token's readings: the stream after each dictionary's block at that token, encoded."""
    model = loaded.model
    dictionaries = list((loaded.dictionaries or {}).values())
    layers = frozenset(block + 1 for block in readings.blocks_read(dictionaries))
    with torch.inference_mode():
        ids = torch.tensor([list(request.ids)], dtype=torch.long, device=next(model.parameters()).device)
        out = hooked.run(model, hooked.embed(model, ids), last_layer=max(layers) - 1, between=between,
                         reads=hooked.Reads(resid=True, first=1, layers=layers))
    return tuple(readings.read(dictionaries, {layer - 1: out.resid[layer][0] for layer in layers}))


class TextFeaturesJobs(ReplyJobs[TextFeaturesRequest, TextFeaturesResult]):
    """The core's executor for a typed text's features."""

    def work(self, request: TextFeaturesRequest, between: Callable[[], None],
             job: Job[TextFeaturesRequest, TextFeaturesResult], core: Worker) -> TextFeaturesResult:
        return TextFeaturesResult(text_features(self.loaded, request, between))


class FeaturesJobs(ReplyJobs[FeaturesRequest, FeaturesResult]):
    """The core's executor for a token's features."""

    def work(self, request: FeaturesRequest, between: Callable[[], None], job: Job[FeaturesRequest, FeaturesResult],
             core: Worker) -> FeaturesResult:
        return FeaturesResult(features_report(self.loaded, request, between, self.prefix))
