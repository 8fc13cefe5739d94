"""bench.peers.llamacpp's two single streams, and their turns: llama.cpp's in a subprocess of its own venv
(LlamaWorker, running WORKER), Glassbox's in this process (GlassboxStream), each started on a prompt and then
asked for a number of greedy decode steps at a time (decode_interleaved)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from bench.peers.llamacpp_env import JsonWorker

# Runs as `VPY -c WORKER GGUF THREADS N_CTX`: loads the model, answers one JSON line per request line. Its
# stdout is a copy of the real one kept for the protocol; anything llama.cpp prints goes to stderr.
WORKER = r"""
import json, os, sys, time
proto = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
import numpy as np
import llama_cpp
path, threads, n_ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = time.perf_counter()
llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=512,
                      logits_all=False, verbose=False)
info = llama_cpp.llama_print_system_info()
proto.write(json.dumps({"load_s": time.perf_counter() - t, "version": llama_cpp.__version__,
                        "system_info": info.decode() if isinstance(info, bytes) else str(info)}) + "\n")
proto.flush()
nv = llm.n_vocab()


def last_logits():
    # with logits_all=False, llama-cpp-python 0.3.x no longer fills llm.scores / llm.eval_logits (its
    # sampler reads the context directly): read the last row from the context, as that sampler does
    return np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(nv,))


tok = None
for line in sys.stdin:
    req = json.loads(line)  # {"ids", "new", "logits"}: a new prompt; {"new"} alone: carry on from the last token
    t0 = time.perf_counter()
    logits, tokens = None, []
    if "ids" in req:
        llm.reset()
        llm.eval(req["ids"])
        last = last_logits()
        tok = int(np.argmax(last))
        tokens.append(tok)
    t1 = time.perf_counter()
    if "ids" in req and req.get("logits"):  # after t1: the prefill's time leaves the copy out, as Glassbox's does
        logits = last[:req.get("vocab", 50257)].tolist()
    t2 = time.perf_counter()
    for _ in range(req["new"]):
        llm.eval([tok])
        tok = int(np.argmax(last_logits()))
        tokens.append(tok)
    t3 = time.perf_counter()
    proto.write(json.dumps({"prefill_s": t1 - t0, "decode_s": t3 - t2, "tokens": tokens, "logits": logits}) + "\n")
    proto.flush()
"""


class LlamaWorker(JsonWorker):
    """One llama.cpp model loaded at one thread count, in a bench-venv subprocess (WORKER)."""

    def __init__(self, path: Path, threads: int, n_ctx: int):
        super().__init__(WORKER, [path, threads, n_ctx])

    def start(self, ids: list[int], logits: bool = False) -> dict:
        """The prompt's prefill and its greedy token (and its logits, when asked)"""
        return self.ask({"ids": ids, "new": 0, "logits": logits})

    def more(self, new: int) -> dict:
        """`new` decode steps from where the last call stopped"""
        return self.ask({"new": new})


# -- Glassbox, in-process ------------------------------------------------------------------------------
GB_PRECISION = {"gb-fp32": "float32", "gb-bf16": "bfloat16", "gb-int8": "int8"}
LLAMA_TYPE = {"llama-f32": "f32", "llama-f16": "f16", "llama-q8_0": "q8_0"}
PAIRS = [("gb-fp32", "llama-f32"), ("gb-bf16", "llama-f16"), ("gb-int8", "llama-q8_0")]


def glassbox_model(size: str, precision: str):
    """A fresh random model (seed 0) at `precision`: webapp.chat.model.precision.apply_precision where it
    exists, else bfloat16 by .to() and no int8 (None)."""
    import torch

    from bench import common
    model = common.random_gpt(size, seed=0)
    try:
        from webapp.chat.model.precision import apply_precision
    except ImportError as error:
        if precision == "float32":
            return model
        if precision == "bfloat16":
            print(f"note: webapp.chat.model.precision not importable ({error}); bfloat16 by model.to()", flush=True)
            return model.to(torch.bfloat16)
        print(f"note: webapp.chat.model.precision not importable ({error}); skipping int8", flush=True)
        return None
    return apply_precision(model, precision).eval()


class GlassboxStream:
    """Greedy decoding in this process, as LlamaWorker does it in its own: the whole prompt through prefill
    (start), then decode_step calls with a list of one KVCache (the app's batched path with one row), `new`
    at a time (more). Token i+1 comes from step i."""

    def __init__(self, model, max_len: int):
        self.model, self.max_len = model, max_len

    def start(self, ids: list[int], logits: bool = False) -> dict:
        import torch

        from webapp.chat.model.gpt import Chunk
        with torch.inference_mode():
            self.cache = self.model.new_cache(batch=1, max_len=self.max_len)
            t0 = time.perf_counter()
            out = self.model.prefill([Chunk(ids, self.cache)])[0]
            self.tok = out.argmax(dim=-1, keepdim=True)  # (1, 1)
            first = int(self.tok)
            t1 = time.perf_counter()
        self.pos = len(ids)
        return {"prefill_s": t1 - t0, "decode_s": 0.0, "tokens": [first],
                "logits": out[0, :50257].float().tolist() if logits else None}

    def more(self, new: int) -> dict:
        import torch
        tokens = []
        with torch.inference_mode():
            t0 = time.perf_counter()
            for _ in range(new):
                out = self.model.decode_step(self.tok, [self.cache], [self.pos])
                self.tok = out.argmax(dim=-1, keepdim=True)
                tokens.append(int(self.tok))  # the host needs it (a server streams it): one sync per token
                self.pos += 1
            t1 = time.perf_counter()
        return {"prefill_s": 0.0, "decode_s": t1 - t0, "tokens": tokens, "logits": None}


def slices(new: int, size: int) -> list[int]:
    """`new` decode steps in turns of `size` (0: all at once)"""
    size = size if size > 0 else new
    return [min(size, new - at) for at in range(0, new, size)]


def decode_interleaved(streams: dict, order: list[str], ids: list[int], new: int, size: int,
                       logits: set[str], between_turns: Callable[[], object] | None = None) -> dict:
    """Every stream's prefill, then its `new` steps in turns of `size`, the variants taking turns (their order
    reversed at every turn: A B C, C B A, ...) so that each meets the machine's changes of pace in the same
    measure; `between_turns` is called after every turn (bench.rooflines.TurnReads: the roofline's divisor read in
    the same minutes) -> {variant: {prefill_s, decode_s (summed), tokens, logits}}"""
    results = {v: streams[v].start(ids, logits=v in logits) for v in order}
    for n in slices(new, size):
        for v in order:
            part = streams[v].more(n)
            results[v]["decode_s"] += part["decode_s"]
            results[v]["tokens"] += part["tokens"]
        if between_turns is not None:
            between_turns()
        order = order[::-1]
    return results
