"""Chat on the shared core: turn a conversation into a reply job, save it. The one place a chat job is
built (the pages and /v1 both submit through `submit_reply`)."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from webapp.chat.decode.types import ChatJob, ChatRequest, ChatResult, Forced, SamplingParams
from webapp.chat.follow import follow_reply
from webapp.chat.leases import Leases, heed
from webapp.chat.model.edits import Edit
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.model.prompt import PromptBuilder, PromptReport
from webapp.chat.records import (
    ChatPage,
    Conversation,
    ConversationFull,
    Message,
    ReplyDetails,
    ReplySignals,
    TurnIds,
)
from webapp.chat.registry import ChatModels, model_record
from webapp.chat.store import ROOT, ChatStore
from webapp.core import InferenceCore, Refused
from webapp.core.jobs import Event, Job, JobState
from webapp.present import CHANGES

DRAWN_SEED_MAX = 2**32 - 1  # the seeds a person may type (webapp/chat/web/forms.py SEED_MAX)


class ChatError(Exception):
    """A request the conversation cannot take now; `status` is the HTTP answer the web layer gives."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Turn:
    """A checked request for a reply, nothing saved yet: where it goes, what the model is given."""

    conversation: Conversation | None  # None: a new conversation
    prompt: PromptReport
    sampling: SamplingParams
    user_text: str | None = None  # the question it answers, when the turn adds one
    # a new version after this message (ROOT: a first message); None: after the branch shown
    branch_from: int | None = None
    forced: Forced | None = None  # the reply's first tokens, given
    model: str = ""  # the registry name of the model that writes the reply
    edit: Edit | None = None  # parts switched off in every forward of the reply (webapp/chat/ablation/service.py)
    intervention: dict | None = None  # what `edit` switched off, as the reply's record keeps it


class ChatService:
    """What the chat views call; knows the store and the core, never the device."""

    def __init__(self, core: InferenceCore, store: ChatStore, models: ChatModels, max_messages: int = 0) -> None:
        self.core = core
        self.store = store
        self.models = models
        # GLASSBOX_MAX_MESSAGES: messages one conversation keeps, every version (regenerated, edited,
        # branched) counted, so that versions are bounded as well as the branch shown; 0: no limit
        self.max_messages = max_messages
        self._leases = Leases(store, self._heed_signals)

    @property
    def model(self) -> LoadedChatModel:
        """The default model (the registry's first)."""
        return self.models.get()

    @property
    def prompts(self) -> PromptBuilder:
        # Tokenizing is pure CPU work, so the request thread may build prompts (and refuse
        # one that is too long before anything is saved); only the worker runs the model.
        return self.model.prompt

    def max_new_tokens_limit(self, model: str | None = None) -> int:
        return self.models.get(model).prompt.max_new_tokens_limit()

    def check_prompt(self, history: Sequence[Message], sampling: SamplingParams, model: str | None = None,
                     question: str | None = None) -> PromptReport:
        """The prompt for a reply by `model` (None: the default) to `history`, and then to `question` when one
        is asked; raises PromptTooLong (nothing saved yet)."""
        turns = [m.turn for m in history if m.said] + ([] if question is None else [{"role": "user",
                                                                                     "content": question}])
        return self.models.get(model).prompt.explain(turns, sampling.max_new_tokens)

    # -- which model --------------------------------------------------------------------------
    def chosen_model(self, name: str | None) -> str:
        """A model named in a request (None or empty: the default). Raises ChatError (400) naming the models."""
        if not name:
            return self.models.default
        if name not in self.models:
            raise ChatError(f"There is no model named {name!r} here. This server runs: "
                            f"{', '.join(self.models.names())}.", 400)
        return name

    def model_gone(self, conversation: Conversation | None) -> str | None:
        """The model a conversation was started with, when this server no longer runs it (its new replies then
        come from the default, and its page says so); None otherwise."""
        name = conversation.model if conversation else None
        return name if name and name not in self.models else None

    def conversation_model(self, conversation: Conversation | None) -> str:
        """The model a conversation's new replies use: the one it was started with, while this server
        runs it; else the default (each reply is labelled with the model that wrote it)."""
        name = conversation.model if conversation else None
        return name if name and name in self.models else self.models.default

    def writer(self, message: Message) -> LoadedChatModel:
        """The model that wrote a reply, to read or continue it with. A reply saved before replies kept
        their model counts as the default's. Raises ChatError (409) when that model is not run here now,
        or runs from another file: never another model's numbers."""
        record = model_record(message)
        problem = self.models.unavailable(record)
        if problem is not None:
            raise ChatError(problem, 409)
        return self.models.get(self.models.running(record))

    def writer_name(self, message: Message) -> str:
        """The name the model that wrote a reply runs under here (ChatModels.running), else the name it was
        saved with (a model not run here: `writer` says why)."""
        record = model_record(message)
        return self.models.running(record) or (record.name if record else self.models.default)

    # -- reading (views never touch the store) -------------------------------------------------
    def conversations(self, owner: str) -> list[Conversation]:
        return self.store.conversations(owner)

    def conversation(self, owner: str, conversation_id: str) -> Conversation | None:
        return self.store.conversation(owner, conversation_id)

    def page(self, owner: str, conversation_id: str | None) -> ChatPage | None:
        """What a chat page shows, read once (ChatStore.page); None when the conversation is not the owner's."""
        return self.store.page(owner, conversation_id)

    def page_after(self, owner: str, before: ChatPage | None, turn: TurnIds) -> ChatPage:
        """The page once a turn was saved: the page before and what the turn saved, or read again when
        the conversation changed meanwhile (or there was no page before)."""
        page = before.after(turn) if before is not None else None
        if page is None:
            page = self.store.page(owner, turn.conversation_id)
        assert page is not None  # saved by this owner
        return page

    def history(self, conversation_id: str) -> list[Message]:
        """The branch shown, oldest first (see ChatStore.messages)."""
        return self.store.messages(conversation_id)

    def message(self, conversation_id: str, message_id: int) -> Message | None:
        return self.store.message(conversation_id, message_id)

    def details(self, message_id: int) -> ReplyDetails:
        return self.store.details(message_id)

    def details_of(self, message_ids: list[int]) -> dict[int, ReplyDetails]:
        return self.store.details_of(message_ids)

    def all_messages(self, conversation_id: str) -> list[Message]:
        return self.store.all_messages(conversation_id)

    def share(self, owner: str, conversation_id: str) -> str | None:
        return self.store.share_conversation(owner, conversation_id)

    def stop_sharing(self, owner: str, conversation_id: str) -> None:
        self.store.stop_sharing(owner, conversation_id)

    def shared(self, token: str) -> tuple[Conversation, list[Message]] | None:
        """A shared conversation and the branch shown, for whoever has the token; None if not shared."""
        conversation = self.store.shared_conversation(token)
        return None if conversation is None else (conversation, self.history(conversation.id))

    def set_token_view(self, conversation_id: str, message_id: int, on: bool) -> None:
        """Read a reply as its tokens (or as text again); kept with the reply, so a streaming one keeps it."""
        self.store.set_token_view(conversation_id, message_id, on)

    def delete(self, owner: str, conversation_id: str) -> None:
        self.store.delete_conversation(owner, conversation_id)

    # -- turns: check, then save in one transaction, submit, take back if refused ----------------
    def send_turn(self, conversation: Conversation | None, content: str, sampling: SamplingParams,
                  history: list[Message] | None = None, model: str | None = None) -> Turn:
        """A new question in a conversation (None: a new one, with `model`, None: the default; a
        conversation's replies use its own), after `history` (the branch shown, when the caller read it
        already). Raises PromptTooLong, ChatError for an unknown model."""
        if history is None:
            history = self.history(conversation.id) if conversation else []
        named = self.chosen_model(model)  # a model named is checked in a new chat and an old one alike (400)
        name = self.conversation_model(conversation) if conversation else named
        prompt = self.check_prompt(history, sampling, name, question=content)
        return Turn(conversation, prompt, sampling, user_text=content, model=name)

    def second_turn(self, turn: Turn, model: str, history: list[Message]) -> Turn:
        """`turn`'s question answered by another model too: a second version of its reply, beside the first
        (where it goes is known once `turn` is saved: `start_both`); `history`: the branch `turn` follows.
        Raises PromptTooLong, ChatError."""
        name = self.chosen_model(model)
        if name == turn.model:
            raise ChatError(f"Choose another model than {name} to ask beside it.", 400)
        return Turn(turn.conversation, self.check_prompt(history, turn.sampling, name, question=turn.user_text or ""),
                    turn.sampling, model=name)

    def start_both(self, owner: str, turn: Turn, second: Turn) -> tuple[TurnIds, int | str]:
        """One question, two models: `turn` saved and queued, then `second` as another version of its reply
        -> (what the first saved, the second reply's id or why it was refused). Raises what `start_turn`
        raises for the first; a refused second leaves the first running (nothing is lost)."""
        ids = self.start_turn(owner, turn)
        question = ids.user_id if ids.user_id is not None else ROOT
        conversation = ids.conversation or self.store.conversation(owner, ids.conversation_id)
        try:
            other = self.start_turn(owner, dataclasses.replace(second, conversation=conversation,
                                                               branch_from=question, user_text=None))
        except (Refused, ChatError) as refused:
            self.store.show_message(ids.conversation_id, ids.reply_id)
            return ids, f"{second.model} could not answer too: {refused}"
        return ids, other.reply_id

    def regenerate_turn(self, conversation: Conversation, sampling: SamplingParams,
                        history: list[Message] | None = None, model: str | None = None) -> Turn:
        """A new version of the last reply, after the same question; the old one stays. `model`: another
        model writes it (None: the model that wrote the reply). (`history`: the branch shown, when the
        caller read it already.)"""
        if history is None:
            history = self.history(conversation.id)
        if not history or not history[-1].is_reply or history[-1].pending:
            raise ChatError("There is no finished reply to regenerate.")
        if model:
            name = self.chosen_model(model)
        else:
            self.writer(history[-1])  # its own model, which must still run here (ChatError 409)
            name = self.writer_name(history[-1])
        return Turn(conversation, self.check_prompt(history[:-1], sampling, name), sampling,
                    branch_from=history[-1].parent_id or ROOT, model=name)

    def edit_turn(self, conversation: Conversation, message: Message, content: str, sampling: SamplingParams,
                  history: list[Message] | None = None) -> Turn:
        """A new version of a question (and a reply to it); the old one stays with what followed it.
        (`history`: the branch shown, when the caller read it already.)"""
        if message.role != "user":
            raise ChatError("Only your own messages can be edited.")
        path = self.history(conversation.id) if history is None else history
        if any(m.pending for m in path):
            raise ChatError("Stop the running reply before editing.")
        shown = [m.id for m in path]
        if message.id not in shown:
            raise ChatError("That message is on a branch not shown; show it first.")
        name = self.conversation_model(conversation)
        prompt = self.check_prompt(path[:shown.index(message.id)], sampling, name, question=content)
        return Turn(conversation, prompt, sampling, user_text=content, branch_from=message.parent_id or ROOT,
                    model=name)

    def rerun_turn(self, conversation: Conversation, message: Message, history: list[Message], edit: Edit,
                   intervention: dict) -> Turn:
        """A new version of a reply written again from its exact saved prompt with its own settings and seed,
        `edit` in every forward (parts switched off, directions added), `intervention` its record. Raises
        ChatError (409): a reply running, or its prompt not kept or damaged."""
        return Turn(conversation, self.saved_prompt(message, history), SamplingParams.saved(message.settings),
                    branch_from=message.parent_id or ROOT, model=self.writer_name(message), edit=edit,
                    intervention=intervention)

    def saved_prompt(self, message: Message, history: list[Message]) -> PromptReport:
        """The exact prompt a finished reply was given, to write it again. Raises ChatError (409): a reply
        running, or its prompt not kept or damaged."""
        if message.pending or any(m.pending for m in history):
            raise ChatError("Stop the running reply before writing it again with the model changed.")
        details = self.details(message.id)
        if not details.prompt or "prompt" in details.damaged:
            raise ChatError("This reply was saved before Glassbox kept its prompt, so it cannot be run again.")
        try:
            return PromptReport.from_dict(details.prompt)
        except (TypeError, ValueError, KeyError):
            raise ChatError("This reply's saved prompt is damaged, so it cannot be run again.") from None

    def branch_turn(self, conversation: Conversation, message: Message, forced: Forced,
                    history: list[Message] | None = None) -> Turn:
        """A new version of a reply that starts with `forced` (its tokens before one, then another) and
        goes on with the reply's own settings and prompt. (`history`: the branch shown, when the caller
        read it already.)"""
        if history is None:
            history = self.history(conversation.id)
        if any(m.pending for m in history):
            raise ChatError("Stop the running reply before branching.")
        self.writer(message)  # the tokens are that model's: it goes on, or nobody does (ChatError 409)
        details = self.details(message.id)
        if not details.odds or not details.prompt:
            raise ChatError("This reply was saved before Glassbox kept its tokens, so it cannot be branched.")
        sampling = SamplingParams.saved(message.settings)
        if len(forced.tokens) > sampling.max_new_tokens:
            raise ChatError(f"That continuation is longer than the reply may be ({sampling.max_new_tokens} tokens).",
                            400)
        return Turn(conversation, PromptReport.from_dict(details.prompt), sampling,
                    branch_from=message.parent_id or ROOT, forced=forced, model=self.writer_name(message))

    def start_turn(self, owner: str, turn: Turn) -> TurnIds:
        """Save the turn and queue the job that writes its reply -> what was saved (ChatStore.begin_turn).
        Raises ChatError (400) for a conversation at its limit of messages, nothing saved. A refused job
        (Refused) or a failure takes back everything saved for it, and re-raises."""
        conversation = turn.conversation
        name = turn.model or self.models.default
        sampling = turn.sampling
        if sampling.seed is None and sampling.temperature > 0:
            # a seed drawn here rather than inside torch: the reply keeps the seed it was really sampled with,
            # so an export can give it (issue 31) and the same seed reproduces the reply
            sampling = dataclasses.replace(sampling, seed=secrets.randbelow(DRAWN_SEED_MAX + 1))
        settings = sampling.as_dict()
        if sampling.seed != turn.sampling.seed:
            settings["seed_drawn"] = True
        if turn.forced is not None and turn.forced.at is not None:  # the version says where it was branched
            settings["branched_at"] = turn.forced.at
        try:
            ids = self.store.begin_turn(owner, conversation.id if conversation else None,
                                        user_text=turn.user_text, branch_from=turn.branch_from,
                                        settings=settings, prompt=turn.prompt.as_dict(),
                                        max_messages=self.max_messages, model=self.models.record(name),
                                        intervention=turn.intervention)
        except ConversationFull as full:
            raise ChatError(str(full), 400) from None
        forced = turn.forced or Forced()
        # a version with parts switched off keeps no features: a token's are read later of the model as it is
        request = ChatRequest(tuple(turn.prompt.ids), sampling, forced=forced.tokens, forced_odds=forced.odds,
                              edit=turn.edit, features=turn.edit is None or not turn.edit.replaces)
        reply_id = ids.reply_id
        self._leases.hold(reply_id)
        try:
            self.submit_reply(owner, request, model=name, ref=reply_id,
                              on_finish=self._leases.finish_saver(reply_id),
                              on_progress=self._leases.progress_saver(reply_id))
        except Exception:
            self._leases.let_go(reply_id)
            self.store.take_back_turn(owner, ids)
            raise
        CHANGES.notify(f"chat:{ids.conversation_id}")  # its followers (a follow link) see the turn at once
        return ids

    def show_version(self, conversation_id: str, message_id: int) -> None:
        """Show another version of a message, and the branch below it."""
        if any(m.pending for m in self.history(conversation_id)):
            raise ChatError("Stop the running reply before switching versions.")
        self.store.show_message(conversation_id, message_id)
        CHANGES.notify(f"chat:{conversation_id}")

    def submit_reply(self, owner: str, request: ChatRequest, *, model: str | None = None, ref: object = None,
                     on_finish: Callable[[ChatJob, JobState, str | None], None] | None = None,
                     on_progress: Callable[[ChatJob], None] | None = None) -> ChatJob:
        """Queue a reply job (its result a ChatResult) for `model` (None: the default) -> the job; raises
        Refused when the core will not take it."""
        kind = self.models.kind(model or self.models.default)
        job: ChatJob = Job(kind, owner, request, on_finish=on_finish, on_progress=on_progress, ref=ref,
                           result=ChatResult())
        return self.core.submit(job)

    def job_for(self, message_id: int) -> ChatJob | None:
        for name in self.models.names():
            job = self.core.find(self.models.kind(name), message_id)
            if job is not None:
                return job
        return None

    def stop(self, message_id: int) -> None:
        job = self.job_for(message_id)
        if job is not None:
            job.cancel()
        else:  # another front end runs it: it reads the request the next time it saves the reply
            self.store.request_stop(message_id)

    def follow(self, message_id: int, heartbeat: float) -> Iterator[Event | None]:
        """The events of a reply that another front end runs, read from the database (webapp/chat/follow.py)."""
        return follow_reply(self.store, message_id, heartbeat)

    # -- on the core's worker ----------------------------------------------------------------
    def _heed_signals(self, message_id: int, signals: ReplySignals) -> None:
        """What another front end asked about a reply this one runs or has queued (Leases)."""
        job = self.job_for(message_id)
        if job is not None:
            heed(job, signals)
