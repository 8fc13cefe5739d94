"""Chat on the shared core: load the model, turn a conversation into a reply job, save it."""

from __future__ import annotations

import threading
from contextlib import closing
from typing import Callable

from webapp.chat.forms import Sampling
from webapp.chat.prompt import PromptBuilder
from webapp.chat.store import ChatStore, ReplyStats
from webapp.core import InferenceCore, Job
from webapp.core.jobs import CANCELLED, DONE
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
    from webapp.chat.model import GPT, compile_decoding
    with one_torch_thread():  # the core's worker must stay the only thread with a thread pool
        loaded = load_chat_model(settings.chat_checkpoint, arch=settings.chat_arch or None,
                                 tokenizer_spec=settings.chat_tokenizer or None,
                                 factory=settings.chat_factory or None, device=settings.device,
                                 dtype=settings.dtype or None)
    if settings.compile and isinstance(loaded.model, GPT):
        compile_decoding(loaded.model)  # compiles during the warm-up, before /readyz says ready
    loaded.torch_threads = reply_threads(loaded.model, settings.chat_torch_threads)
    return loaded


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
        self._jobs: dict[int, str] = {}  # assistant message id -> job id, while it may stream
        self._lock = threading.Lock()

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

    def check_prompt(self, history: list[dict], sampling: Sampling) -> list[int]:
        """The prompt ids for a reply to `history`; raises PromptTooLong (nothing saved yet)."""
        turns = [{"role": m["role"], "content": m["content"]} for m in history
                 if m["role"] == "user" or m["status"] in ("complete", "stopped")]
        return self.prompts.build(turns, sampling.max_new_tokens)

    def start_reply(self, owner: str, conversation_id: str, prompt_ids: list[int], sampling: Sampling,
                    then: Callable[[int], None] | None = None) -> int:
        """Save a pending assistant message and queue the job that writes it.

        `then(message_id)` runs once the core has taken the job: what a reply replaces (the old
        reply, the turns after an edited message) is dropped only then, so a refused job loses nothing.
        """
        message_id = self.store.add_message(conversation_id, "assistant", "", status="pending",
                                            settings=sampling.as_dict())
        job = Job("chat", owner, self._runner(prompt_ids, sampling), on_finish=self._saver(message_id))
        try:
            self.core.submit(job)
        except Exception:
            self.store.delete_message(conversation_id, message_id)
            raise
        with self._lock:
            self._jobs[message_id] = job.id
        if then is not None:
            try:
                then(message_id)
            except Exception:  # e.g. the database was busy: take the new reply back, keep the old state
                job.cancel()
                self.store.delete_message(conversation_id, message_id)
                raise
        return message_id

    def job_for(self, message_id: int) -> Job | None:
        with self._lock:
            job_id = self._jobs.get(message_id)
        return self.core.get(job_id) if job_id else None

    def stop(self, message_id: int) -> None:
        job = self.job_for(message_id)
        if job is not None:
            job.cancel()

    # -- on the core's worker ----------------------------------------------------------------
    def _runner(self, prompt_ids: list[int], sampling: Sampling):
        def run(job: Job, core: InferenceCore) -> None:
            from webapp.chat.generate import generate
            from webapp.chat.prefix_cache import prefix_cache_for
            job.result["text"], first = [], None
            loaded = core.models["chat"]
            # The worker owns the device, so it alone keeps the last reply's KV cache: a follow-up turn
            # prefills only what follows the unchanged prefix. closing(): a cancelled job (emit raises)
            # hands the cache back at once instead of whenever the generator is collected.
            prefix = prefix_cache_for(loaded.model) if loaded.supports_kv_cache else None
            pieces = generate(loaded, prompt_ids, max_new_tokens=sampling.max_new_tokens,
                              temperature=sampling.temperature, top_k=sampling.top_k, seed=sampling.seed,
                              should_stop=lambda: job.cancelled, prefix_cache=prefix)
            with torch_threads(loaded.torch_threads), closing(pieces):
                for piece in pieces:
                    if piece.text:
                        job.result["text"].append(piece.text)
                    if piece.stats is not None:  # the last piece: the generator's own figures
                        s = piece.stats
                        job.result["stats"] = ReplyStats(s.new_tokens, s.time_to_first_token_s,
                                                         s.decode_tokens_per_s)
                    elif piece.tokens:
                        core.count("tokens")
                        first = piece.elapsed_s if first is None else first
                        job.result["stats"] = _stats(first, piece.elapsed_s, piece.tokens)
                    if piece.text:
                        job.emit("token", text=piece.text)  # raises JobCancelled once stopped
        return run

    def _saver(self, message_id: int):
        def save(job: Job, outcome: str, error: str | None) -> None:
            text = "".join(job.result.get("text", []))
            status = STATUS_OF_OUTCOME.get(outcome, "error")
            self.store.finish_reply(message_id, text, status, error, job.result.get("stats", ReplyStats()))
        return save


def _stats(first: float, elapsed: float, tokens: int) -> ReplyStats:
    """Figures so far, kept for a reply that is stopped before the generator's own stats."""
    rate = (tokens - 1) / (elapsed - first) if tokens > 1 and elapsed > first else None
    return ReplyStats(tokens=tokens, ttft_seconds=first, tokens_per_second=rate)
