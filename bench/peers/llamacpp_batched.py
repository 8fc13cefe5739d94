"""Batched decode: Glassbox's batched step (bench.decode.batch_step.measure) beside llama.cpp's continuous batching
(one llama_decode carrying one token of each of B sequences), per precision, in one run, interleaved.

    .venv/bin/python -m bench.peers.llamacpp --batched --gguf-writer glassbox    # gpt2-254m, 2 threads, B 1 8 16
    .venv/bin/python -m bench.peers.llamacpp --batched --threads 2 --batches 1,8,16 --reps 3 --steps 10

Each row of both engines holds its own context (--contexts' first value + 7 r tokens of seed r, as
bench.decode.batch_step's caches_for makes them) and every step decodes at that same context again. For each
precision pair (float32 / f32, bfloat16 / f16, int8 / q8_0) the Glassbox model and a llama.cpp worker are
loaded, then for each rep and batch size Glassbox's steps and llama.cpp's run one after the other; tokens/s
= B / the median step, and each rep's own ratio (median and range over reps). Beside each engine's rate its
roofline (bench.rooflines.roofline): B × the read bandwidth at that thread count (measured in every rep, median)
÷ the bytes a step of B rows must read (its tensors at their stored types, each row's keys and values at its
own context: Glassbox's float32 or bfloat16 cache, llama.cpp's f16). llama.cpp's environment and GGUF files are
bench.peers.llamacpp's.
"""

from __future__ import annotations

from pathlib import Path

from bench.peers.llamacpp_env import JsonWorker, OtherLoad, export_and_convert

# Runs as `VPY -c BATCH_WORKER GGUF THREADS MAX_BATCH CONTEXT`: llama.cpp's own continuous batching through
# llama-cpp-python's low-level API. It prefills MAX_BATCH sequences (sequence r: CONTEXT + 7 r prompt ids of
# seed r, as bench.decode.batch_step's rows; ids given on stdin first), each into its own KV cells, then answers one
# JSON line per request line ({"batch": B, "steps": S}) with the seconds of S timed llama_decode calls (after
# one warm-up), each carrying one token of each of the first B sequences at its own next position, logits for
# every row. After each call the new token is dropped again (llama_memory_seq_rm), so every step decodes at
# the same context, as bench.decode.batch_step's steps do.
BATCH_WORKER = r"""
import json, os, sys, time
proto = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
import numpy as np
import llama_cpp as L
path, threads, max_batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prompts = json.loads(sys.stdin.readline())
L.llama_backend_init()
model_params = L.llama_model_default_params()
# ggml's AMX buffer type (its q8_0 / f16 tile kernels, preferred where the CPU reports AMX) dies of SIGILL in
# its first matrix product on this project's Xeon VM; without the extra buffer types llama.cpp runs its
# AVX-512 (VNNI, bf16) kernels, its default on every CPU without AMX
model_params.use_extra_bufts = False
model = L.llama_model_load_from_file(path.encode(), model_params)
params = L.llama_context_default_params()
per_seq = max(len(p) for p in prompts) + 8
params.n_ctx = per_seq * max_batch
params.n_batch = params.n_ubatch = 512
params.n_seq_max = max_batch
params.n_threads = params.n_threads_batch = threads
params.no_perf = True
ctx = L.llama_init_from_model(model, params)
memory = L.llama_get_memory(ctx)
batch = L.llama_batch_init(512, 0, 1)
n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))


def fill(entries):  # (token, position, sequence, logits?) per row of one llama_decode
    batch.n_tokens = len(entries)
    for i, (tok, pos, seq, out) in enumerate(entries):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, pos, 1, out
        batch.seq_id[i][0] = seq


for seq, ids in enumerate(prompts):  # each sequence's context, 512 tokens per call at most
    for at in range(0, len(ids) - 1, 512):
        part = ids[at:min(at + 512, len(ids) - 1)]
        fill([(tok, at + i, seq, False) for i, tok in enumerate(part)])
        if L.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed in the prefill")
info = L.llama_print_system_info()
proto.write(json.dumps({"version": L.__version__, "n_ctx": L.llama_n_ctx(ctx),
                        "system_info": info.decode() if isinstance(info, bytes) else str(info)}) + "\n")
proto.flush()
for line in sys.stdin:
    req = json.loads(line)
    rows = [(prompts[r][-1], len(prompts[r]) - 1, r, True) for r in range(req["batch"])]
    times = []
    for step in range(req["steps"] + 1):  # the first is a warm-up
        fill(rows)
        t = time.perf_counter()
        status = L.llama_decode(ctx, batch)
        times.append(time.perf_counter() - t)
        if status != 0:
            raise SystemExit(f"llama_decode failed ({status}) at batch {req['batch']}")
        logits = [np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,)) for i in range(len(rows))]
        argmax = [int(np.argmax(row)) for row in logits]
        for tok, pos, seq, _ in rows:
            L.llama_memory_seq_rm(memory, seq, pos, -1)
    proto.write(json.dumps({"times": times[1:], "argmax": argmax}) + "\n")
    proto.flush()
"""


class BatchWorker(JsonWorker):
    """llama.cpp's batched decode of `len(prompts)` sequences, in a bench-venv subprocess (BATCH_WORKER)."""

    def __init__(self, path: Path, threads: int, prompts: list[list[int]]):
        super().__init__(BATCH_WORKER, [path, threads, len(prompts)], first=prompts)

    def step_times(self, batch: int, steps: int) -> list[float]:
        return self.ask({"batch": batch, "steps": steps})["times"]


PAIRS = {"float32": "f32", "bfloat16": "f16", "int8": "q8_0"}


def main(args) -> int:
    import torch

    from bench import common, rooflines
    from bench.decode.batch_step import caches_for, measure
    from webapp.chat.model.precision import apply_precision
    load_before = common.load_average()
    threads = [int(t) for t in args.threads.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    context = int(args.contexts.split(",")[0])
    precisions = args.precisions.split(",")
    fp32 = common.random_gpt(args.size, seed=0)
    paths = export_and_convert(args.size, fp32, args.gguf_writer)
    prompts = [common.prompt_ids(context + 7 * r, seed=r) for r in range(max(batches))]
    results = {}  # (threads, precision, batch) -> [(glassbox step s, llama.cpp step s) per rep]
    others, info = [], {}
    bandwidths: dict[int, list[float]] = {t: [] for t in threads}
    step_bytes = {}  # (precision, batch) -> (Glassbox's bytes a step, llama.cpp's)
    for t in threads:
        torch.set_num_threads(t)
        reads = rooflines.TurnReads()  # the divisor, read after every batch size's pair of measurements
        for precision in precisions:
            model = apply_precision(common.random_gpt(args.size, seed=0), precision).eval()
            idx, caches, positions = caches_for(model, max(batches), context, torch.device("cpu"))
            worker = BatchWorker(paths[PAIRS[precision]], t, prompts)
            info = worker.info
            load = OtherLoad([worker.proc.pid])
            llama_weights = rooflines.gguf_weight_bytes(paths[PAIRS[precision]])
            for b in batches:  # row r attends over its context + 7 r prompt ids in both engines
                step_bytes[precision, b] = (
                    rooflines.step_bytes(model, [positions[r] + 1 for r in range(b)]),
                    llama_weights + sum(rooflines.kv_bytes(model.config, len(prompts[r]), rooflines.LLAMACPP_KV_BYTES)
                                        for r in range(b)))
            try:
                for rep in range(args.reps):
                    for b in batches:
                        load.start()
                        ours = common.median(measure(model, idx, caches, positions, b, args.steps, odds=False)[0])
                        theirs = common.median(worker.step_times(b, args.steps))
                        others.append(load.cores())
                        reads()
                        results.setdefault((t, precision, b), []).append((ours, theirs))
                        print(f"  threads {t} {precision} B={b} rep {rep + 1}: Glassbox {b / ours:.1f} tok/s, "
                              f"llama.cpp {b / theirs:.1f} tok/s ({theirs / ours:.2f}x)", flush=True)
            finally:
                worker.close()
            del model, caches
        bandwidths[t] = reads.readings
    bandwidth = {t: common.median(bandwidths[t]) for t in threads}
    rows = []
    for (t, precision, b), pairs in results.items():
        ours = common.median(p[0] for p in pairs)
        theirs = common.median(p[1] for p in pairs)
        ratios = [p[1] / p[0] for p in pairs]
        gb_bytes, llama_bytes = step_bytes[precision, b]
        rows.append([t, f"{precision} / {PAIRS[precision]}", b,
                     b / ours, *rooflines.roofline(b / ours, gb_bytes, bandwidth[t], rows=b),
                     b / theirs, *rooflines.roofline(b / theirs, llama_bytes, bandwidth[t], rows=b), theirs / ours,
                     f"{common.median(ratios):.3g} ({min(ratios):.3g}–{max(ratios):.3g})"])
    body = (common.table(["threads", "precision (Glassbox / llama.cpp)", "B", "Glassbox tok/s",
                          "Glassbox roofline tok/s", "Glassbox fraction", "llama.cpp tok/s", "llama.cpp roofline tok/s",
                          "llama.cpp fraction", "Glassbox ÷ llama.cpp", "per rep: median (range)"], rows) + "\n\n"
            + rooflines.roofline_note(bandwidth, bandwidths, rooflines.READ_IN_TURNS)
            + f"- one decode step of B rows, each with its own context of {context} + 7 r tokens, decoded at that "
            + f"context again each step; {args.steps} timed steps (after a warm-up) per batch size and rep, their "
            + f"median; {args.reps} reps, the two engines one after the other in each; tokens/s = B / step\n"
            + "- Glassbox: bench.decode.batch_step.measure (model.decode_step over B KV caches, logits for every row, "
            + "no odds); webapp.chat.model.precision.apply_precision\n"
            + f"- llama.cpp: llama-cpp-python {info.get('version')}, one llama_decode with one token of each of B "
            + f"sequences (n_seq_max {max(batches)}, n_ctx {info.get('n_ctx')}, logits for every row, "
            + "use_extra_bufts off: ggml's AMX buffer type dies of SIGILL here), "
            + f"n_threads = n_threads_batch; GGUF by --gguf-writer {args.gguf_writer}; system info: "
            + f"`{info.get('system_info', 'n/a').strip()}`\n"
            + "- other processes' CPU use while timing (/proc/stat less this benchmark's): median "
            + f"{common.median(others):.2f} cores, at most {max(others):.2f}\n")
    common.report(f"Batched decode step: Glassbox vs llama.cpp ({args.size})", body, load_before=load_before,
                  write_doc=not args.no_doc)
    return 0
