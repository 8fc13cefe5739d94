"""Steering beside llama.cpp: the same direction added by Glassbox (a steered reply: webapp/chat/steering/compute.py)
and by llama.cpp's control vector (the file Glassbox exports, applied with llama.cpp's own `cvec` call), on the
bundled chat model exported to GGUF f32 by Glassbox's writer; greedy replies compared token for token, with the
direction and without it, and each engine's decode rate steered and plain.

    .venv/bin/python -m bench.peers.llamacpp_steering          # the first run builds llama-cpp-python (minutes)
    .venv/bin/python -m bench.peers.llamacpp_steering --new 64 --alpha 6 --no-doc

llama.cpp adds a control vector's `direction.N` to the stream after block N (N >= 1; it has no slot for block 0),
at every position, prompt and reply alike: Glassbox's convention for α·v after block L (docs/api.md, "Steering"). The
direction here is a random unit vector times --alpha, after the middle block; the check has teeth only when the
steered reply differs from the plain one, which the report says.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import torch

from bench import common
from bench.peers import llamacpp_env as env

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "models/chat/model.safetensors"
PROMPT = "Hello! Who are you?"

# Runs as `VPY -c WORKER GGUF THREADS`, one JSON request on stdin: {"ids", "new", "n_embd", "n_layer", "runs":
# [null or {"layer", "vector"}]} -> one JSON line per run: the greedy tokens and the decode's seconds. It imports
# only llama_cpp and numpy; llama.cpp's prints go to stderr.
WORKER = r"""
import ctypes, json, os, sys, time
proto = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
import numpy as np
import llama_cpp
path, threads = sys.argv[1], int(sys.argv[2])
req = json.loads(sys.stdin.readline())
llm = llama_cpp.Llama(model_path=path, n_ctx=1024, n_threads=threads, n_threads_batch=threads, logits_all=False,
                      verbose=False)
apply = getattr(llama_cpp, "llama_apply_adapter_cvec", None) or getattr(llama_cpp, "llama_control_vector_apply")
nv, n_embd, n_layer = llm.n_vocab(), req["n_embd"], req["n_layer"]

banned = req["banned"]  # the specials: neither engine ends the reply, so whole replies are compared

def last_logits():
    logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(nv,)).copy()
    logits[banned] = -np.inf
    return logits

llm.eval(req["ids"][:8])  # warm-up: the first evaluation allocates the compute graph
for run in req["runs"]:
    if run is None:  # no control vector: llama.cpp clears it when given no data
        rc = apply(llm._ctx.ctx, None, 0, n_embd, 0, 0)
    else:  # one buffer for blocks 1 .. n_layer - 1, block N's direction at (N - 1) * n_embd
        data = np.zeros(n_embd * (n_layer - 1), dtype=np.float32)
        layer = run["layer"]
        data[(layer - 1) * n_embd:layer * n_embd] = np.asarray(run["vector"], dtype=np.float32)
        rc = apply(llm._ctx.ctx, data.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), data.size, n_embd, 1,
                   n_layer - 1)
    if rc != 0:
        raise SystemExit(f"llama.cpp refused the control vector ({rc})")
    llm.reset()
    llm.eval(req["ids"])
    tokens = [int(np.argmax(last_logits()))]
    t = time.perf_counter()
    for _ in range(req["new"] - 1):
        llm.eval([tokens[-1]])
        tokens.append(int(np.argmax(last_logits())))
    proto.write(json.dumps({"tokens": tokens, "decode_s": time.perf_counter() - t,
                            "version": llama_cpp.__version__}) + "\n")
    proto.flush()
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--new", type=int, default=48, help="greedy tokens per reply")
    p.add_argument("--alpha", type=float, default=80.0,
                   help="the direction's strength (a unit vector times this; the bundled model's stream has norm ~80)")
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--layer", type=int, default=None, help="after this block (default: the middle one; >= 1)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def glassbox_reply(loaded, ids: list[int], new: int, edit) -> tuple[list[int], float]:
    """Greedy tokens (the model's specials masked) and the decode's seconds after the first token."""
    from webapp.chat.decode.generate import Sequence, decode_step
    from webapp.chat.decode.types import SamplingParams
    seq = Sequence(loaded, ids, SamplingParams(new, 0.0, 0), edit=edit)
    while seq.prefilling:
        seq.prefill_chunk()
    started = time.perf_counter()
    while not seq.finished:
        decode_step(loaded.model, [seq])
    return seq.ids[len(ids):], time.perf_counter() - started


def main(argv=None):
    args = parse_args(argv)
    load_before = common.load_average()
    from webapp.chat.model.gguf import export_gguf
    from webapp.chat.model.loading import load_chat_model
    from webapp.chat.model.steer import Term, steer_edit
    env.setup(converter=False)
    loaded = load_chat_model(str(BUNDLED))
    model = loaded.model
    banned = torch.tensor(sorted(loaded.tokenizer.special_ids.values()))
    model.lm_head.register_forward_hook(lambda m, a, logits: logits.index_fill_(-1, banned, float("-inf")))
    C, L = model.config.n_embd, model.config.n_layer
    layer = args.layer if args.layer is not None else L // 2
    if not 1 <= layer < L:
        raise SystemExit(f"--layer {layer}: llama.cpp's control vectors reach blocks 1 to {L - 1}")
    vector = torch.randn(C, generator=torch.Generator().manual_seed(0))
    vector = (vector / vector.norm() * args.alpha).tolist()
    gguf = env.HOME / "models" / "bundled-chat-f32.gguf"
    gguf.parent.mkdir(parents=True, exist_ok=True)
    export_gguf(loaded, gguf, "f32")
    ids = loaded.prompt.build([{"role": "user", "content": args.prompt}], args.new)
    specials = sorted(loaded.tokenizer.special_ids.values())
    request = {"ids": ids, "new": args.new, "n_embd": C, "n_layer": L, "banned": specials,
               "runs": [None, {"layer": layer, "vector": vector}]}
    worker = subprocess.run([str(env.VPY), "-c", WORKER, str(gguf), str(args.threads)], input=json.dumps(request),
                            capture_output=True, text=True)
    if worker.returncode:
        raise SystemExit(f"llama.cpp's run failed:\n{worker.stderr[-3000:]}")
    plain_l, steered_l = (json.loads(line) for line in worker.stdout.strip().splitlines()[-2:])
    torch.set_num_threads(args.threads)
    glassbox_reply(loaded, ids, 4, None)  # warm-up: the decode kernel's first call
    plain_g, plain_s = glassbox_reply(loaded, ids, args.new, None)
    steer = steer_edit([Term(layer, tuple(vector), 1.0)], "cpu", torch.float32)
    steered_g, steered_s = glassbox_reply(loaded, ids, args.new, steer)

    def first_difference(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    def agree(a: list[int], b: list[int]) -> str:
        same = first_difference(a, b)
        return "all" if same == len(a) == len(b) else f"first {same}"

    rate = lambda n, s: f"{(n - 1) / s:,.0f}" if s > 0 else "–"  # noqa: E731
    rows = [["plain", agree(plain_g, plain_l["tokens"]), rate(args.new, plain_s), rate(args.new, plain_l["decode_s"])],
            [f"α·v after block {layer}", agree(steered_g, steered_l["tokens"]), rate(args.new, steered_s),
             rate(args.new, steered_l["decode_s"])]]
    def text(tokens: list[int]) -> str:
        return b"".join(loaded.tokenizer.decode_single_token_bytes(t) for t in tokens).decode("utf-8", "replace")

    body = (common.table(["reply", f"greedy tokens equal (of {args.new})", "Glassbox tokens/s",
                          f"llama.cpp {steered_l['version']} tokens/s"], rows)
            + f"\n\n- the bundled chat model, float32 (GGUF f32 by Glassbox's writer), prompt {args.prompt!r} in the "
              f"chat template; a random unit direction times α = {args.alpha} after block {layer}; "
              f"{args.threads} threads"
            + f"\n- the steered reply differs from the plain one from token {first_difference(plain_g, steered_g)} on "
              f"(plain {text(plain_g[:24])!r}…, steered {text(steered_g[:24])!r}…)")
    common.report("Steering beside llama.cpp's control vectors", body, load_before=load_before,
                  write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
