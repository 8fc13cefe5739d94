"""Inside a reply's token, on the shared core: check that it can be looked into, build the job's request
from what the reply saved (its exact prompt and its tokens), submit it (or join the one already running),
and keep finished reports, a bounded number, least recently used forgotten first (webapp/core/kept.py)."""

from __future__ import annotations

from typing import TypeVar

from webapp.chat import interventions
from webapp.chat.directions import DirectionStore, terms_of
from webapp.chat.inside.jobs import InsideReport, InsideRequest, InsideResult
from webapp.chat.model.hooked import layout_problem
from webapp.chat.model.steer import ClampTerm, Term
from webapp.chat.records import Message, ReplyDetails, Status
from webapp.chat.registry import ChatModels, ModelRecord, Work, model_record
from webapp.chat.reports import ReportJobs
from webapp.chat.service import ChatError
from webapp.core import InferenceCore

Built = TypeVar("Built")
REMOTE = ("Replies here come from a remote server (GLASSBOX_CHAT_BACKEND), not from a model running in "
          "Glassbox, so there is nothing inside to show.")


class InsideService(ReportJobs[InsideRequest, InsideResult, InsideReport]):
    """What the Inside views call; knows the core and the chat service's store, never the device."""

    def __init__(self, core: InferenceCore, models: ChatModels, keep: int = 32,
                 directions: DirectionStore | None = None) -> None:
        # kept under (the model that works it out, the request): two models' reports on one text are two
        super().__init__(core, models, Work.INSIDE, keep, lambda result: result.report, InsideResult)
        self.directions = directions  # a steered version's directions (None: steered versions are read unsteered)
        self._layout: dict[int, str | None] = {}  # id(model) -> why it cannot be looked into

    def writer(self, message: Message) -> str:
        """The registry name of the model that wrote a reply (the default for one saved before replies kept
        their model). Raises ChatError (409) when it is not run here now, or from another file."""
        record: ModelRecord | None = model_record(message)
        problem = self.models.unavailable(record)
        name = self.models.running(record)
        if problem is not None or name is None:
            raise ChatError(problem or "This reply's model is not run here.", 409)
        return name

    def unavailable(self, name: str | None = None) -> str | None:
        """Why Inside cannot run on a model here (None: it can): a remote backend, or a model without
        nanoGPT's layout."""
        loaded = self.models.get(name)
        if getattr(loaded, "remote", False):
            return REMOTE
        key = id(loaded.model)
        if key not in self._layout:
            problem = layout_problem(loaded.model)
            self._layout[key] = None if problem is None else f"Inside cannot look into this model: {problem}."
        return self._layout[key]

    def request_for(self, message: Message, details: ReplyDetails, index: int) -> InsideRequest:
        """The ids the model had when it produced token `index` of a reply. Raises ChatError (404, 409)."""
        model = self.writer(message)
        block_size = self.models.get(model).block_size
        if message.role != "assistant":
            raise ChatError("Only replies have tokens to look into.", 404)
        if message.status == Status.PENDING:
            raise ChatError("This reply is still being written; look inside it once it has finished.", 409)
        odds, prompt = details.odds, details.prompt
        if odds is None or prompt is None:
            raise ChatError("This reply was saved before Glassbox kept its tokens and prompt.", 404)
        if not odds:
            raise ChatError("This reply has no tokens to look into.", 404)
        if not 0 <= index < len(odds):
            raise ChatError(f"No such token in this reply: it has tokens 0 to {len(odds) - 1}.", 404)
        reply = [row[0] for row in odds]
        # past the window the generator goes on from the last block_size ids (generate.Sequence._open_window)
        context = (list(prompt["ids"]) + reply[:index])[-block_size:]
        return InsideRequest(tuple(context), reply[index], index, self.steer_of(model, message))

    def steer_of(self, model: str, message: Message) -> tuple[Term | ClampTerm, ...]:
        """The directions a steered version's run added (its record), () for any other: every glass-box view
        of a steered version reads the steered model. Raises ChatError (409) for a record that cannot be read,
        or a direction deleted since."""
        try:
            found = message.change
        except ValueError:
            raise ChatError("This version's record of how the model was changed cannot be read.", 409) from None
        if not isinstance(found, interventions.Steering) or self.directions is None:
            return ()
        loaded = self.models.get(model).dictionaries or {}
        missing = [c.dictionary for c in found.clamps if c.dictionary not in loaded]
        if missing:
            raise ChatError(f"This version clamped a feature of the dictionary {missing[0]!r}, which the model no "
                            "longer loads, so it cannot be read again.", 409)
        return terms_of(self.directions, model, found)
