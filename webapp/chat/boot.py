"""Chat at start-up, called by the app factory: load the model, choose the executor the core runs its
replies with, warm it up, and build the service the views call."""

from __future__ import annotations

import ctypes
import logging
import os

from webapp.chat.decode.alone import ChatAlone
from webapp.chat.decode.batched import ChatBatch
from webapp.chat.decode.generate import generate
from webapp.chat.decode.prefill import pin_prompt_head
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.decode.remote.executor import remote_executor
from webapp.chat.features.dictionaries import load_dictionaries
from webapp.chat.model import kernels
from webapp.chat.model.errors import ModelLoadError
from webapp.chat.model.loading import LoadedChatModel, load_chat_model
from webapp.chat.registry import ChatModels, model_entries
from webapp.chat.service import ChatService
from webapp.chat.store import ChatStore
from webapp.core import InferenceCore
from webapp.core.threads import one_torch_thread, torch_threads
from webapp.db import AnyDatabase

# Below this much weight a reply runs on one intra-op thread: a small model is about as fast on one as
# on two on a quiet machine, but many times slower on two when another process holds a core (each operator
# then waits a scheduler slice for its second thread; docs/benchmarks.md, "Intra-op threads").
SMALL_MODEL_BYTES = 64 * 2**20


def reply_threads(model, setting: int) -> int:
    """Intra-op threads for replies: the setting, else 1 for a small model, else 0 (the worker's)."""
    if setting:
        return setting
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return 1 if size < SMALL_MODEL_BYTES else 0


def load_model(settings):
    with one_torch_thread():  # the core's worker must stay the only thread with a thread pool
        loaded = load_chat_model(settings.chat_checkpoint, arch=settings.chat_arch or None,
                                 tokenizer_spec=settings.chat_tokenizer or None,
                                 factory=settings.chat_factory or None, device=settings.device,
                                 dtype=settings.dtype or None)
    loaded.torch_threads = reply_threads(loaded.model, settings.chat_torch_threads)
    if not getattr(settings, "chat_backend", ""):  # a remote model's stream is not here to read
        loaded.dictionaries = load_dictionaries(settings.chat_dictionaries, settings.chat_checkpoint, loaded.model,
                                                loaded.tokenizer)
    if settings.device == "cpu":  # compiled here, once per machine, rather than on the first reply
        if kernels.library() is not None:
            logging.getLogger("glassbox").info("decode kernel compiled for this CPU, in %s", kernels.cache_dir())
    # With a remote backend the local model still gives the tokenizer and the window (prompt budget,
    # prompt view); the replies come from the backend (webapp/chat/decode/remote/executor.py).
    loaded.remote = bool(getattr(settings, "chat_backend", ""))
    return loaded


def load_models(settings) -> ChatModels:
    """Every model of the registry (GLASSBOX_CHAT_MODELS, else the one model's settings), loaded at start:
    a broken one stops start-up, its name in the message; so does a registry whose checkpoints would not fit in
    the memory this machine has free (each model is held whole, in this one process)."""
    loaded, per_model = {}, {}
    entries = model_entries(settings)
    if settings.chat_models:
        check_memory(entries, f"GLASSBOX_CHAT_MODELS={settings.chat_models}")
    for entry in entries:
        try:
            loaded[entry.name] = load_model(entry.settings)
        except ModelLoadError as error:
            if not settings.chat_models:
                raise
            where = f"GLASSBOX_CHAT_MODELS={settings.chat_models}, [models.{entry.name}]"
            raise ModelLoadError(f"{where}: {error}") from None
        per_model[entry.name] = entry.settings
    give_back_freed_memory()
    return ChatModels(loaded, per_model)


def check_memory(entries, where: str) -> None:
    """Refuse a registry whose local checkpoints take more on disk than this machine has free (MemAvailable):
    about what they take loaded, and loading a hundred of them took gigabytes before any said why. Raises
    ModelLoadError naming both sizes. Files that do not exist are left to the load, which names them."""
    sizes = [os.path.getsize(e.settings.chat_checkpoint) for e in entries
             if not e.settings.chat_backend and os.path.isfile(e.settings.chat_checkpoint)]
    free = available_memory()
    if free is not None and sum(sizes) > free:
        raise ModelLoadError(f"{where}: its {len(sizes)} checkpoints take {sum(sizes) / 2**30:.1f} GiB, about what "
                             f"they take in memory, and this machine has {free / 2**30:.1f} GiB free: run fewer "
                             "models, or smaller ones")


def available_memory() -> int | None:
    """Bytes of memory free for a new load (Linux's MemAvailable); None where it cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def give_back_freed_memory() -> None:
    """Loading makes float32 copies (the checkpoint's tensors, the weights before their precision) and frees
    them; glibc keeps much of that in the process unless asked to return it (docs/benchmarks.md, "Two 254M
    chat models in one process"). Elsewhere than glibc, nothing to do."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def as_registry(models: ChatModels | LoadedChatModel | None) -> ChatModels:
    """What the app factory was given for chat (tests give one loaded model, or several by name)."""
    if models is None:
        return ChatModels({})
    return models if isinstance(models, ChatModels) else ChatModels.one(models)


def executor(loaded, settings):
    """The core's executor for chat jobs: a remote OpenAI-compatible backend when configured
    (GLASSBOX_CHAT_BACKEND), else the batched decoder, or one reply at a time without a KV cache."""
    if getattr(settings, "chat_backend", ""):
        remote = remote_executor(loaded, settings)  # a bad GLASSBOX_CHAT_BACKEND* stops start-up here
        loaded.remote = True
        return remote
    if loaded.supports_kv_cache:
        prefix = prefix_cache(loaded)
        prefix.budget_bytes = settings.kv_cache_mb * 2**20
        return ChatBatch(loaded, max_rows=settings.max_batch, prefix=prefix)
    return ChatAlone(loaded)


def prefix_cache(loaded) -> PrefixCache:
    """The loaded model's PrefixCache (finished replies' KV caches), built here once and passed to the
    batched executor, the warm-up's pinned head, Inside and attribution, which share it."""
    if loaded.prefix_cache is None:
        loaded.prefix_cache = PrefixCache()
    return loaded.prefix_cache


def warm_up(loaded) -> None:
    """One short greedy reply, so the first visitor does not pay for lazy initialisation."""
    if getattr(loaded, "remote", False):  # replies come from a backend: nothing local to warm up
        return
    ids = loaded.prompt.build([{"role": "user", "content": "Hi"}], 2)
    with torch_threads(loaded.torch_threads):
        for _ in generate(loaded, ids, max_new_tokens=2, temperature=0.0):
            pass
        if loaded.supports_kv_cache:  # replies arriving together need not each prefill the few-shot turns
            pin_prompt_head(loaded, [loaded.prompt.bos, *loaded.prompt.fewshot_ids], prefix_cache(loaded))


def service(core: InferenceCore, db: AnyDatabase, models: ChatModels, max_messages: int = 0) -> ChatService:
    store = ChatStore(db)
    store.finish_deletions()  # a conversation whose deletion the last process did not finish
    return ChatService(core, store, models, max_messages)
