"""Chat on the shared core: load the model, turn a conversation into a reply job, save it."""

from __future__ import annotations

from webapp.chat.batch import ChatAlone, ChatBatch, ChatRequest, Forced
from webapp.chat.forms import Sampling
from webapp.chat.generate import SamplingParams
from webapp.chat.prompt import PromptBuilder, PromptReport
from webapp.chat.store import ChatStore, ReplyStats
from webapp.core.engine import InferenceCore
from webapp.core.jobs import CANCELLED, DONE, Job
from webapp.core.threads import one_torch_thread, torch_threads

STATUS_OF_OUTCOME = {DONE: "complete", CANCELLED: "stopped"}  # anything else is an error
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
    return loaded


def executor(loaded, settings):
    """The core's executor for chat jobs: the batched decoder, or one reply at a time without a KV cache."""
    if loaded.supports_kv_cache:
        return ChatBatch(loaded, max_rows=settings.max_batch, kv_cache_bytes=settings.kv_cache_mb * 2**20)
    return ChatAlone(loaded)


def warm_up(loaded) -> None:
    """One short greedy reply, so the first visitor does not pay for lazy initialisation."""
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

    def start_reply(self, owner: str, conversation_id: str, prompt: PromptReport, sampling: Sampling,
                    forced: Forced | None = None) -> int:
        """Save a pending assistant message (after the branch shown) and queue the job that writes it;
        a refused job, or a failing save, takes the message back. `forced`: the reply's first tokens
        are given (a branch from a token of another version), the model goes on from them."""
        message_id = self.store.add_message(conversation_id, "assistant", "", status="pending",
                                            settings=sampling.as_dict())
        params = SamplingParams(sampling.max_new_tokens, sampling.temperature, sampling.top_k, sampling.seed)
        request = ChatRequest(tuple(prompt.ids), params, forced=forced.tokens if forced else (),
                              forced_odds=forced.odds if forced else ())
        job = Job("chat", owner, request, on_finish=self._saver(message_id),
                  on_progress=lambda job: self.store.save_progress(message_id, "".join(job.result["text"])),
                  ref=message_id)
        try:
            self.store.save_prompt(message_id, prompt.as_dict())
            self.core.submit(job)
        except Exception:
            self.store.delete_message(conversation_id, message_id)
            raise
        return message_id

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
            self.store.finish_reply(message_id, text, status, error, job.result.get("stats", ReplyStats()), odds)
        return save

