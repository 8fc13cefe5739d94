"""The logit lens over a whole reply, on the shared core: the Inside service's checks (the model that wrote the
reply, running here, in nanoGPT's layout), a request built from what the reply saved (its exact prompt, its
tokens, what its run had switched off), a job per request on the writer's "lens" kind (or the one already
queued or running), and finished reports kept, a bounded number, under their request."""

from __future__ import annotations

from typing import Any, TypeVar

from webapp.chat.ablation.compute import Parts, parse_parts
from webapp.chat.inside.service import InsideService
from webapp.chat.interventions import Ablation
from webapp.chat.lens.jobs import LensReport, LensRequest, LensResult
from webapp.chat.records import Message, ReplyDetails, Status
from webapp.chat.registry import Work
from webapp.chat.reports import ReportJobs
from webapp.chat.service import ChatError
from webapp.core import InferenceCore

Built = TypeVar("Built")
MAX_COLUMNS = 256  # reply tokens shown: (n_layer + 1) × 256 cells is already a large page


class LensService(ReportJobs[LensRequest, LensResult, LensReport]):
    """What the lens views call; knows the core and the Inside service, never the device."""

    def __init__(self, core: InferenceCore, inside: InsideService, keep: int = 32) -> None:
        super().__init__(core, inside.models, Work.LENS, keep, lambda result: result.report, LensResult)
        self.inside = inside

    def request_for(self, model: str, message: Message, details: ReplyDetails) -> LensRequest:
        """The reply's exact prompt, its first tokens (at most MAX_COLUMNS, and only those whose context fit
        the model's window in one piece) and what its run switched off. Raises ChatError (404, 409)."""
        if message.role != "assistant":
            raise ChatError("Only replies have tokens to look into.", 404)
        if message.status == Status.PENDING:
            raise ChatError("This reply is still being written; look inside it once it has finished.", 409)
        odds, prompt = details.odds, details.prompt
        if odds is None or prompt is None or {"prompt", "odds"} & set(details.damaged):
            raise ChatError("This reply's tokens and prompt were not kept (or are damaged).", 404)
        if not odds:
            raise ChatError("This reply has no tokens to look into.", 404)
        prompt_ids = tuple(prompt["ids"])
        # past the window the generator went on from the last block_size ids (generate.Sequence._open_window):
        # those tokens' positions are not the ones one forward over the prompt and the reply would give
        fits = self.models.get(model).block_size - len(prompt_ids) + 1
        if fits < 1:
            raise ChatError("This reply's prompt fills the model's window.", 409)
        reply = tuple(row[0] for row in odds[:min(MAX_COLUMNS, fits)])
        return LensRequest(prompt_ids, reply, self.parts_of(model, message), self.inside.steer_of(model, message))

    def parts_of(self, model: str, message: Message) -> Parts | None:
        """What the reply's run switched off (its record, `messages.intervention`), None for nothing."""
        try:
            change = message.change
        except ValueError:
            raise ChatError("This version's record of what was switched off cannot be read.", 409) from None
        if not isinstance(change, Ablation):  # the model's own run, or a steered one (Inside's steer_of)
            return None
        record = change.record
        config: Any = self.models.get(model).model.config  # nanoGPT's layout: checked before (unavailable)
        try:
            return parse_parts(record.get("heads") or [], record.get("layers") or [], record.get("mlps") or [],
                               record.get("mode"), config.n_layer, config.n_head)
        except (ValueError, AttributeError):
            raise ChatError("This version's record of what was switched off cannot be read.", 409) from None
