"""Switch parts off, and watch the reply change: on the shared core, from what a reply saved.

- A reply ablated: its exact saved prompt run again with its own sampling settings and seed, with the chosen
  heads, attention layers or MLPs zeroed or mean-ablated in every forward (webapp/chat/ablation/compute.py
  defines both). The result is a new version of the reply (beside it, as Regenerate's), its record keeping
  what was switched off (`messages.intervention`), its label saying so. It runs as any reply, a row of the
  batched decoder with an Edit of its own; its KV cache is its own alone (generate.Sequence).
- One position with parts switched off: the odds where token i of a reply was chosen, with and without them.

What needs the model first (a mean ablation's means, one position's odds) is a whole job of the model's
"ablate" kind (webapp/chat/ablation/jobs.py); results are kept under their request, a bounded number.
"""

from __future__ import annotations

from typing import Any

from webapp.chat.ablation.compute import Parts, intervention, parse_parts, zero_edit
from webapp.chat.ablation.jobs import AblationRequest, AblationResult
from webapp.chat.model.edits import Edit
from webapp.chat.model.hooked import layout_problem
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.records import Conversation, Message, Status
from webapp.chat.registry import Work
from webapp.chat.reports import ReportJobs
from webapp.chat.service import ChatError, ChatService, Turn
from webapp.core import InferenceCore

REMOTE_MODEL = ("Replies here come from a remote server (GLASSBOX_CHAT_BACKEND), not from a model running in "
                "Glassbox, so no part of it can be switched off.")
NO_CACHE = ("Switching parts off needs Glassbox's own GPT (a model with a KV cache); this model comes from "
            "another factory.")


def config_of(loaded: LoadedChatModel) -> Any:
    """The model's config (n_layer, n_head): every model parts of which can be switched off has one."""
    model: Any = loaded.model
    return model.config


class AblationService(ReportJobs[AblationRequest, AblationResult, AblationResult]):
    """What the ablation views call; knows the core and the chat service, never the device."""

    def __init__(self, core: InferenceCore, chat: ChatService, keep: int = 32) -> None:
        super().__init__(core, chat.models, Work.ABLATE, keep,
                         lambda result: result if result.edit is not None else None, AblationResult)
        self.chat = chat

    # -- checks ------------------------------------------------------------------------------
    def writer(self, message: Message) -> tuple[str, LoadedChatModel]:
        """The model that wrote a reply, if parts of it can be switched off here. Raises ChatError: 404 for
        a question, 409 when that model is not run here, is remote, or has not nanoGPT's layout."""
        if message.role != "assistant":
            raise ChatError("Only replies can be run again with parts switched off.", 404)
        loaded = self.chat.writer(message)  # 409 naming the model when it is not run here
        problem = self.unavailable(loaded)
        if problem is not None:
            raise ChatError(problem, 409)
        return self.chat.writer_name(message), loaded

    @staticmethod
    def unavailable(loaded: LoadedChatModel) -> str | None:
        if getattr(loaded, "remote", False):
            return REMOTE_MODEL
        problem = layout_problem(loaded.model)
        if problem is not None:
            return f"Parts of this model cannot be switched off: {problem}."
        if not loaded.supports_kv_cache:
            return NO_CACHE
        return None

    @staticmethod
    def parts(loaded: LoadedChatModel, fields: dict) -> Parts:
        """The parts a request names (form or JSON fields). Raises ChatError (400) naming a bad one."""
        config = config_of(loaded)
        try:
            return parse_parts(fields.get("heads"), fields.get("layers"), fields.get("mlps"), fields.get("mode"),
                               config.n_layer, config.n_head)
        except ValueError as error:
            raise ChatError(str(error), 400) from None

    # -- a reply, ablated ---------------------------------------------------------------------
    def reply_request(self, message: Message, parts: Parts, history: list[Message]) -> AblationRequest:
        """What the ablated run starts from: the reply's exact saved prompt. Raises ChatError (409)."""
        return AblationRequest(tuple(self.chat.saved_prompt(message, history).ids), parts)

    def reply_turn(self, conversation: Conversation, message: Message, history: list[Message], parts: Parts,
                   edit: Edit) -> Turn:
        """A new version of the reply: its prompt, its settings and seed, `edit` in every forward."""
        _, loaded = self.writer(message)
        return self.chat.rerun_turn(conversation, message, history, edit,
                                    intervention(parts, config_of(loaded).n_head))

    @staticmethod
    def zero_edit(loaded: LoadedChatModel, parts: Parts) -> Edit:
        return zero_edit(parts, config_of(loaded).n_head)

    # -- one position ------------------------------------------------------------------------
    def position_request(self, message: Message, details, index: int, parts: Parts) -> AblationRequest:
        """Token `index` of a finished reply: the ids before it (prompt, then the reply's tokens before it).
        Raises ChatError (404, 409)."""
        _, loaded = self.writer(message)
        if message.status == Status.PENDING:
            raise ChatError("This reply is still being written; switch parts off once it has finished.", 409)
        odds, prompt = details.odds, details.prompt
        if odds is None or prompt is None or {"prompt", "odds"} & set(details.damaged):
            raise ChatError("This reply's tokens and prompt were not kept (or are damaged).", 404)
        if not 0 <= index < len(odds):
            raise ChatError(f"No such token in this reply: it has tokens 0 to {len(odds) - 1}.", 404)
        reply = [row[0] for row in odds]
        context = (list(prompt["ids"]) + reply[:index])[-loaded.block_size:]  # as the reply's own window
        return AblationRequest(tuple(context), parts, position=True, token=reply[index])

    # -- jobs ----------------------------------------------------------------------------------
