"""Chat on the shared core: load the model, turn a conversation into a reply job, save it."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from webapp.chat.batch import ChatAlone, ChatBatch, ChatRequest, Forced
from webapp.chat.forms import Sampling
from webapp.chat.generate import SamplingParams
from webapp.chat.prompt import PromptBuilder, PromptReport
from webapp.chat.store import ROOT, ChatStore, ReplyStats
from webapp.core.engine import InferenceCore
from webapp.core.jobs import CANCELLED, DONE, Job
from webapp.core.threads import one_torch_thread, torch_threads

STATUS_OF_OUTCOME = {DONE: "complete", CANCELLED: "stopped"}  # anything else is an error


class ChatError(Exception):
    """A request the conversation cannot take now; `status` is the HTTP answer the web layer gives."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Turn:
    """A checked request for a reply, nothing saved yet: where it goes, what the model is given."""

    conversation: dict | None  # None: a new conversation
    prompt: PromptReport
    sampling: Sampling
    user_text: str | None = None  # the question it answers, when the turn adds one
    branch_from: int | None = None  # a new version after this message (ROOT: a first message); None: after the branch shown
    forced: Forced | None = None  # the reply's first tokens, given
# Below this much weight a reply runs on one intra-op thread. The bundled 14 MB model decodes 410
# tokens/s on one thread either way, 520 on two on a quiet machine, but 17 on two when another process
# holds a core: each operator then waits a scheduler slice for its second thread (docs/benchmarks.md,
# "intra-op threads"). Far more than anyone reads, every time, beats a little faster when quiet.
SMALL_MODEL_BYTES = 64 * 2**20


def reply_threads(model, setting: int) -> int:
    """Intra-op threads for replies: the setting, else 1 for a small model, else 0 (the worker's)."""
    if setting:
        return setting
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return 1 if size < SMALL_MODEL_BYTES else 0


def load_model(settings):
    from webapp.chat.loading import load_chat_model
    with one_torch_thread():  # the core's worker must stay the only thread with a thread pool
        loaded = load_chat_model(settings.chat_checkpoint, arch=settings.chat_arch or None,
                                 tokenizer_spec=settings.chat_tokenizer or None,
                                 factory=settings.chat_factory or None, device=settings.device,
                                 dtype=settings.dtype or None)
    loaded.torch_threads = reply_threads(loaded.model, settings.chat_torch_threads)
    if settings.device == "cpu":  # compiled here, once per machine, rather than on the first reply
        from webapp.chat import kernels
        if kernels.library() is not None:
            logging.getLogger("glassbox").info("decode kernel compiled for this CPU, in %s", kernels.cache_dir())
    # With a remote backend the local model still gives the tokenizer and the window (prompt budget,
    # prompt view); the replies come from the backend (webapp/chat/remote.py).
    loaded.remote = bool(getattr(settings, "chat_backend", ""))
    return loaded


def executor(loaded, settings):
    """The core's executor for chat jobs: a remote OpenAI-compatible backend when configured
    (GLASSBOX_CHAT_BACKEND), else the batched decoder, or one reply at a time without a KV cache."""
    if getattr(settings, "chat_backend", ""):
        from webapp.chat.remote import remote_executor
        remote = remote_executor(loaded, settings)  # a bad GLASSBOX_CHAT_BACKEND* stops start-up here
        loaded.remote = True
        return remote
    if loaded.supports_kv_cache:
        return ChatBatch(loaded, max_rows=settings.max_batch, kv_cache_bytes=settings.kv_cache_mb * 2**20)
    return ChatAlone(loaded)


def warm_up(loaded) -> None:
    """One short greedy reply, so the first visitor does not pay for lazy initialisation."""
    if getattr(loaded, "remote", False):  # replies come from a backend: nothing local to warm up
        return
    from webapp.chat.generate import generate
    ids = loaded.prompt.build([{"role": "user", "content": "Hi"}], 2)
    with torch_threads(loaded.torch_threads):
        for _ in generate(loaded, ids, max_new_tokens=2, temperature=0.0):
            pass


class ChatService:
    """What the chat views call; knows the store and the core, never the device."""

    def __init__(self, core: InferenceCore, store: ChatStore) -> None:
        self.core = core
        self.store = store

    @property
    def model(self):
        return self.core.models["chat"]

    @property
    def prompts(self) -> PromptBuilder:
        # Tokenizing is pure CPU work, so the request thread may build prompts (and refuse
        # one that is too long before anything is saved); only the worker runs the model.
        return self.model.prompt

    def max_new_tokens_limit(self) -> int:
        return self.prompts.max_new_tokens_limit()

    def check_prompt(self, history: list[dict], sampling: Sampling) -> PromptReport:
        """The prompt for a reply to `history`; raises PromptTooLong (nothing saved yet)."""
        turns = [{"role": m["role"], "content": m["content"]} for m in history
                 if m["role"] == "user" or m["status"] in ("complete", "stopped")]
        return self.prompts.explain(turns, sampling.max_new_tokens)

    # -- reading (views never touch the store) -------------------------------------------------
    def conversations(self, owner: str) -> list[dict]:
        return self.store.conversations(owner)

    def conversation(self, owner: str, conversation_id: str) -> dict | None:
        return self.store.conversation(owner, conversation_id)

    def history(self, conversation_id: str) -> list[dict]:
        """The branch shown, oldest first (see ChatStore.messages)."""
        return self.store.messages(conversation_id)

    def message(self, conversation_id: str, message_id: int) -> dict | None:
        return self.store.message(conversation_id, message_id)

    def details(self, message_id: int) -> dict:
        return self.store.details(message_id)

    def all_messages(self, conversation_id: str) -> list[dict]:
        return self.store.all_messages(conversation_id)

    def share(self, owner: str, conversation_id: str) -> str | None:
        return self.store.share_conversation(owner, conversation_id)

    def share_token(self, owner: str, conversation_id: str) -> str | None:
        return self.store.conversation_share(owner, conversation_id)

    def stop_sharing(self, owner: str, conversation_id: str) -> None:
        self.store.stop_sharing(owner, conversation_id)

    def shared(self, token: str) -> tuple[dict, list[dict]] | None:
        """A shared conversation and the branch shown, for whoever has the token; None if not shared."""
        conversation = self.store.shared_conversation(token)
        return None if conversation is None else (conversation, self.history(conversation["id"]))

    def set_token_view(self, conversation_id: str, message_id: int, on: bool) -> None:
        """Read a reply as its tokens (or as text again); kept with the reply, so a streaming one keeps it."""
        self.store.set_token_view(conversation_id, message_id, on)

    def delete(self, owner: str, conversation_id: str) -> None:
        self.store.delete_conversation(owner, conversation_id)

    # -- turns: check, then save in one transaction, submit, take back if refused ----------------
    def send_turn(self, conversation: dict | None, content: str, sampling: Sampling, max_messages: int) -> Turn:
        """A new question in a conversation (None: a new one). Raises ChatError, PromptTooLong."""
        history = self.history(conversation["id"]) if conversation else []
        if len(history) + 2 > max_messages:
            raise ChatError(f"This conversation has reached its limit of {max_messages} messages. Start a new chat.",
                            400)
        prompt = self.check_prompt(history + [{"role": "user", "content": content, "status": "complete"}], sampling)
        return Turn(conversation, prompt, sampling, user_text=content)

    def regenerate_turn(self, conversation: dict, sampling: Sampling) -> Turn:
        """A new version of the last reply, after the same question; the old one stays."""
        history = self.history(conversation["id"])
        if not history or history[-1]["role"] != "assistant" or history[-1]["status"] == "pending":
            raise ChatError("There is no finished reply to regenerate.")
        return Turn(conversation, self.check_prompt(history[:-1], sampling), sampling,
                    branch_from=history[-1]["parent_id"] or ROOT)

    def edit_turn(self, conversation: dict, message: dict, content: str, sampling: Sampling) -> Turn:
        """A new version of a question (and a reply to it); the old one stays with what followed it."""
        if message["role"] != "user":
            raise ChatError("Only your own messages can be edited.")
        path = self.history(conversation["id"])
        if any(m["status"] == "pending" for m in path):
            raise ChatError("Stop the running reply before editing.")
        shown = [m["id"] for m in path]
        if message["id"] not in shown:
            raise ChatError("That message is on a branch not shown; show it first.")
        history = path[:shown.index(message["id"])] + [{**message, "content": content}]
        return Turn(conversation, self.check_prompt(history, sampling), sampling, user_text=content,
                    branch_from=message["parent_id"] or ROOT)

    def branch_turn(self, conversation: dict, message: dict, forced: Forced) -> Turn:
        """A new version of a reply that starts with `forced` (its tokens before one, then another) and
        goes on with the reply's own settings and prompt."""
        if any(m["status"] == "pending" for m in self.history(conversation["id"])):
            raise ChatError("Stop the running reply before branching.")
        details = self.details(message["id"])
        if not details["odds"] or not details["prompt"]:
            raise ChatError("This reply was saved before Glassbox kept its tokens, so it cannot be branched.")
        sampling = Sampling(**{k: v for k, v in (message["settings"] or {}).items()
                               if k in ("max_new_tokens", "temperature", "top_k", "seed")})
        if len(forced.tokens) > sampling.max_new_tokens:
            raise ChatError(f"That continuation is longer than the reply may be ({sampling.max_new_tokens} tokens).",
                            400)
        return Turn(conversation, PromptReport.from_dict(details["prompt"]), sampling,
                    branch_from=message["parent_id"] or ROOT, forced=forced)

    def start(self, owner: str, turn: Turn) -> tuple[dict, int, bool]:
        """Save the turn and queue the job that writes its reply -> (conversation, reply id, created).
        A refused job (Refused) or a failure takes back everything saved for it, and re-raises."""
        conversation = turn.conversation
        ids = self.store.begin_turn(owner, conversation["id"] if conversation else None, user_text=turn.user_text,
                                    branch_from=turn.branch_from, settings=turn.sampling.as_dict(),
                                    prompt=turn.prompt.as_dict())
        p = turn.sampling
        forced = turn.forced or Forced(())
        request = ChatRequest(tuple(turn.prompt.ids), SamplingParams(p.max_new_tokens, p.temperature, p.top_k, p.seed),
                              forced=forced.tokens, forced_odds=forced.odds)
        reply_id = ids.reply_id
        job = Job("chat", owner, request, on_finish=self._saver(reply_id),
                  on_progress=lambda job: self.store.save_progress(reply_id, "".join(job.result["text"])),
                  ref=reply_id)
        try:
            self.core.submit(job)
        except Exception:
            self.store.take_back_turn(owner, ids)
            raise
        return self.store.conversation(owner, ids.conversation_id), reply_id, ids.created

    def show_version(self, conversation_id: str, message_id: int) -> None:
        """Show another version of a message, and the branch below it."""
        if any(m["status"] == "pending" for m in self.history(conversation_id)):
            raise ChatError("Stop the running reply before switching versions.")
        self.store.show_message(conversation_id, message_id)

    def job_for(self, message_id: int) -> Job | None:
        return self.core.find("chat", message_id)

    def stop(self, message_id: int) -> None:
        job = self.job_for(message_id)
        if job is not None:
            job.cancel()

    # -- on the core's worker ----------------------------------------------------------------
    def _saver(self, message_id: int):
        def save(job: Job, outcome: str, error: str | None) -> None:
            text = "".join(job.result.get("text", []))
            status = STATUS_OF_OUTCOME.get(outcome, "error")
            odds = [o.as_row() for o in job.result.get("odds", [])]
            stats = job.result.get("stats", ReplyStats())
            if job.started is not None:  # how long it waited for a free row, shown apart from its first token
                stats = dataclasses.replace(stats, wait_seconds=job.started - job.created)
            self.store.finish_reply(message_id, text, status, error, stats, odds)
        return save

