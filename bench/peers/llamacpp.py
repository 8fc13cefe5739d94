"""Single-stream decoding: Glassbox (PyTorch, CPU) vs llama.cpp on the same random weights.

    .venv/bin/python -m bench.peers.llamacpp              # gpt2-254m, threads 1,2, contexts 300,800, 200 new, 3 reps
    .venv/bin/python -m bench.peers.llamacpp --size gpt2 --threads 2 --contexts 300 --reps 1 --new 50 --no-doc
    .venv/bin/python -m bench.peers.llamacpp --batched    # batched steps, both engines (llamacpp_batched.py)
    .venv/bin/python -m bench.peers.llamacpp --setup-only # build the llama.cpp environment and the GGUF files

What it measures: single-stream greedy decoding (one sequence, batch 1, on the CPU) of Glassbox's own
path (prefill over the prompt, then decode_step with one KVCache per token, in this process) against
llama.cpp (llama-cpp-python's Llama.eval, one token per call, in a subprocess of its own venv), on the same
random weights (bench.common.random_gpt(--size), seed 0) and the same prompt ids (bench.common.prompt_ids),
at matching precisions: gb-fp32 / llama-f32, gb-bf16 / llama-f16, gb-int8 / llama-q8_0 (Glassbox's
bf16 and int8 through webapp.chat.model.precision.apply_precision; int8 is skipped with a note where that module
is missing). For each thread count (torch.set_num_threads; llama.cpp n_threads = n_threads_batch) and
context: prefill seconds, decode tokens/s (--new single-token steps / their seconds), their medians over
--reps, and Glassbox ÷ llama.cpp. Within a rep every variant prefills, then the variants take turns of --slice
decode steps each (A B C, C B A, ...): this VM's read bandwidth swings between two levels within seconds, and
whole runs one after the other met different levels (one rep's ratio 0.73×, the next 1.12×). Also how far the
two agree: the largest |logit difference| after the prompt (fp32 vs f32, the first 50257 ids) and, for each
variant, how many greedy tokens match Glassbox fp32's before the first difference. The table is printed and,
unless --no-doc, appended to docs/benchmarks-history.md (bench.common.report). Beside every decode rate, its
roofline (bench.rooflines.roofline): the read bandwidth taken after every turn at that thread count
(bench.rooflines.TurnReads, median) ÷ the bytes one step reads — Glassbox's tensors at their stored types,
llama.cpp's GGUF tensors at theirs (bench.rooflines.gguf_weight_bytes), each with its KV cache (float32 or
bfloat16; llama.cpp's f16) at the mean context of the run's steps — and the fraction of it reached. With only
Glassbox's variants (--variants gb-fp32,gb-bf16,gb-int8) nothing of llama.cpp's environment is built or read.

Its environment is its own, under .bench/llamacpp/ (gitignored), made on first use and reused: a venv
(torch==2.13.0 CPU first, for the converter; numpy, safetensors, transformers, pyyaml, tqdm), the
llama-cpp-python sdist, llama.cpp's convert_hf_to_gguf.py, conversion/ and gguf-py taken from it, and
llama-cpp-python built from that sdist with CMAKE_ARGS="-DGGML_NATIVE=ON" (this CPU's AVX-512 kernels).
The first run's setup takes about 12 minutes on 2 cores, 9 of them the llama.cpp build (log in
.bench/llamacpp/build.log); the GGUF files (f32, f16, q8_0 of the exported model, under
.bench/llamacpp/models/SIZE/, 1.8 GB for gpt2-254m) take about a minute and are cached too. The default
run then takes roughly 20 minutes. Run it on a quiet machine: with as many threads as cores, any other
busy process slows both engines many times over (llama.cpp's spinning thread barrier the most); the
report gives how many cores other processes kept busy during the timed runs (from /proc/stat). Never
part of `make test`: nothing imports this module, and its first run needs PyPI.
"""

from __future__ import annotations

import argparse
import time

from bench.peers.llamacpp_env import CMAKE_ARGS, LLAMA_CPP_PYTHON, OtherLoad, export_and_convert, setup
from bench.peers.llamacpp_streams import (
    GB_PRECISION,
    LLAMA_TYPE,
    PAIRS,
    GlassboxStream,
    LlamaWorker,
    decode_interleaved,
    glassbox_model,
)


# -- the benchmark ---------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="gpt2-254m", help="a preset of webapp.chat.model.gpt.PRESETS")
    p.add_argument("--threads", default="1,2", help="thread counts (torch.set_num_threads; llama.cpp n_threads)")
    p.add_argument("--contexts", default="300,800", help="prompt lengths in tokens")
    p.add_argument("--new", type=int, default=200, help="decode steps (new tokens) per run")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--slice", type=int, default=20,
                   help="decode steps each variant takes at its turn before the next variant's (0: a whole run)")
    p.add_argument("--variants", default=",".join(v for pair in PAIRS for v in pair))
    p.add_argument("--batched", action="store_true",
                   help="time one batched decode step at --batches (both engines) instead of single streams")
    p.add_argument("--batches", default="1,8,16", help="--batched: rows per step")
    p.add_argument("--steps", type=int, default=10, help="--batched: timed steps per batch size and rep")
    p.add_argument("--precisions", default="float32,bfloat16,int8", help="--batched: Glassbox's precisions")
    p.add_argument("--gguf-writer", choices=["llamacpp", "glassbox"], default="llamacpp",
                   help="who writes the GGUF files: llama.cpp's convert_hf_to_gguf.py (needs torch and "
                   "transformers in the bench venv) or webapp.chat.model.gguf (in this process)")
    p.add_argument("--setup-only", action="store_true", help="build the environment and the GGUF files; time nothing")
    p.add_argument("--no-doc", action="store_true", help="print only; do not append to docs/benchmarks-history.md")
    return p.parse_args(argv)


def first_divergence(a: list[int], b: list[int], n: int) -> int | None:
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None


def main(argv=None):
    args = parse_args(argv)
    needs_llama = args.batched or args.setup_only or any(v in LLAMA_TYPE for v in args.variants.split(","))
    if needs_llama:
        setup(converter=args.gguf_writer == "llamacpp")
    if args.batched and not args.setup_only:
        from bench.peers import llamacpp_batched
        return llamacpp_batched.main(args)
    import torch

    from bench import common, rooflines
    load_before = common.load_average()
    if not args.setup_only:
        probe = OtherLoad()
        probe.start()
        time.sleep(1.0)
        if (before := probe.cores()) > 0.25:
            print(f"warning: other processes keep {before:.1f} cores busy: the timings (2 threads above "
                  "all) will suffer", flush=True)
    fp32 = common.random_gpt(args.size, seed=0)
    paths = export_and_convert(args.size, fp32, args.gguf_writer) if needs_llama else {}
    if args.setup_only:
        for t, p in paths.items():
            print(f"{t}: {p} ({p.stat().st_size / 1e6:.0f} MB)")
        return
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in GB_PRECISION and v not in LLAMA_TYPE]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {list(GB_PRECISION) + list(LLAMA_TYPE)}")
    threads = [int(t) for t in args.threads.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    n_ctx = max(contexts) + args.new + 8
    if max(contexts) + args.new + 1 > fp32.config.block_size:
        raise SystemExit(f"context + new exceeds the model's {fp32.config.block_size} positions")
    n_params = fp32.num_params()

    gb = {}
    for v in variants:
        if v in GB_PRECISION:
            m = fp32 if v == "gb-fp32" else glassbox_model(args.size, GB_PRECISION[v])
            if m is not None:
                gb[v] = m
    variants = [v for v in variants if v in gb or v in LLAMA_TYPE]
    notes = [f"{v}: skipped (webapp.chat.model.precision could not make it)" for v in args.variants.split(",")
             if v in GB_PRECISION and v not in gb]

    runs = {}  # (threads, context, variant) -> list of results
    info = {}
    bandwidths: dict[int, list[float]] = {t: [] for t in threads}
    for t in threads:
        torch.set_num_threads(t)
        workers = {}
        for v in variants:
            if v in LLAMA_TYPE:
                workers[v] = LlamaWorker(paths[LLAMA_TYPE[v]], t, n_ctx)
                info = workers[v].info
                print(f"  loaded {v} with {t} threads in {info['load_s']:.2f}s", flush=True)
        try:
            streams = {v: GlassboxStream(gb[v], n_ctx) for v in gb}
            streams.update(workers)
            load = OtherLoad([w.proc.pid for w in workers.values()])
            # allocator, oneDNN primitives, ggml's thread pool: before any timing
            decode_interleaved(streams, variants, common.prompt_ids(40, seed=40), 4, 0, set())
            reads = rooflines.TurnReads()
            for r in range(args.reps):
                for c in contexts:
                    load.start()
                    order = variants if r % 2 == 0 else variants[::-1]
                    logits = {"gb-fp32", "llama-f32"} if r == 0 else set()
                    results = decode_interleaved(streams, order, common.prompt_ids(c), args.new, args.slice, logits,
                                                 reads)
                    others = load.cores()
                    for v, res in results.items():
                        runs.setdefault((t, c, v), []).append({**res, "others": others})
                    print(f"  threads {t} context {c} rep {r + 1}: " + ", ".join(
                        f"{v} {args.new / runs[t, c, v][-1]['decode_s']:.1f} tok/s" for v in variants)
                        + f" (other processes: up to {max(runs[t, c, v][-1]['others'] for v in variants):.2f} cores)",
                        flush=True)
            bandwidths[t] = reads.readings
        finally:
            for w in workers.values():
                w.close()

    def rate(t, c, v):
        rs = runs.get((t, c, v))
        return common.median(args.new / x["decode_s"] for x in rs) if rs else float("nan")

    def prefill(t, c, v):
        rs = runs.get((t, c, v))
        return common.median(x["prefill_s"] for x in rs) if rs else float("nan")

    def paired(t, c, g, lc):
        """Each rep's ratio (the two ran side by side, in the same minute): median, lowest, highest. Less
        spread than the ratio of medians when the machine's speed drifts between reps."""
        ratios = [x["decode_s"] and y["decode_s"] / x["decode_s"] for x, y in
                  zip(runs.get((t, c, g), []), runs.get((t, c, lc), []))]
        if not ratios:
            return "n/a"
        return f"{common.median(ratios):.3g} ({min(ratios):.3g}–{max(ratios):.3g})"

    bandwidth = {t: common.median(bandwidths[t]) for t in threads}
    llama_weights = {v: rooflines.gguf_weight_bytes(paths[LLAMA_TYPE[v]]) for v in variants if v in LLAMA_TYPE}

    def step_bytes(v: str, c: int) -> float:
        """Bytes one of variant v's decode steps reads after a c-token prompt (at the run's mean context)."""
        context = rooflines.mean_context(c, args.new)
        if v in gb:
            return rooflines.step_bytes(gb[v], [context])
        if v in llama_weights:
            return llama_weights[v] + rooflines.kv_bytes(fp32.config, context, rooflines.LLAMACPP_KV_BYTES)
        return float("nan")

    rows = []
    for t in threads:
        for c in contexts:
            for g, lc in PAIRS:
                if g not in variants and lc not in variants:
                    continue
                rg, rl = rate(t, c, g), rate(t, c, lc)
                rows.append([t, c, f"{g} / {lc}", rg, *rooflines.roofline(rg, step_bytes(g, c), bandwidth[t]),
                             rl, *rooflines.roofline(rl, step_bytes(lc, c), bandwidth[t]), rg / rl,
                             paired(t, c, g, lc), prefill(t, c, g), prefill(t, c, lc)])
    header = ["threads", "context", "precisions", "Glassbox tok/s", "Glassbox roofline tok/s", "Glassbox fraction",
              "llama.cpp tok/s", "llama.cpp roofline tok/s", "llama.cpp fraction", "Glassbox ÷ llama.cpp",
              "per rep: median (range)", "Glassbox prefill s", "llama.cpp prefill s"]

    # agreement, from the first rep: logits after the prompt (fp32 vs f32), greedy streams vs gb-fp32
    agree_rows = []
    for t in threads:
        for c in contexts:
            ref = runs.get((t, c, "gb-fp32"))
            if not ref:
                continue
            ref = ref[0]
            other = runs.get((t, c, "llama-f32"))
            diff = float("nan")
            if other and ref["logits"] and other[0]["logits"]:
                a = torch.tensor(ref["logits"])
                b = torch.tensor(other[0]["logits"])
                diff = float((a - b).abs().max())
            cells = []
            for v in variants:
                if v == "gb-fp32":
                    continue
                d = first_divergence(ref["tokens"], runs[t, c, v][0]["tokens"], args.new)
                cells.append(f"{v} {args.new if d is None else d}/{args.new}"
                             + ("" if d is None else f" (first differs at {d})"))
            agree_rows.append([t, c, diff, "; ".join(cells)])
    agree = common.table(["threads", "context", "max abs logit diff gb-fp32 vs llama-f32 (50257 ids)",
                          "greedy tokens equal to gb-fp32's before the first difference"], agree_rows)

    others = [x["others"] for rs in runs.values() for x in rs]
    sizes = ", ".join(f"{k} {p.stat().st_size / 1e6:.0f} MB" for k, p in paths.items())
    system = info.get("system_info", "n/a")
    read = ", ".join(f"{v} {step_bytes(v, contexts[0]) / 2**20:.0f} MiB" for v in variants)
    body = (common.table(header, rows) + "\n\n" + agree + "\n\n"
            + rooflines.roofline_note(bandwidth, bandwidths, rooflines.READ_IN_TURNS)
            + f"- bytes a step reads after the {contexts[0]}-token prompt (at its steps' mean context): {read}\n"
            + f"- model: random `{args.size}` (seed 0, {n_params / 1e6:.1f}M parameters), exported by "
            + "webapp.chat.model.hf.export_hf and converted by llama.cpp's convert_hf_to_gguf.py "
            + f"(--outtype f32/f16/q8_0; GGUF {sizes})\n"
            + f"- llama.cpp: llama-cpp-python {info.get('version', LLAMA_CPP_PYTHON)} built from source with "
            + f"CMAKE_ARGS=`{CMAKE_ARGS}`; n_threads = n_threads_batch = threads, n_batch 512, n_ctx {n_ctx}; "
            + f"system info: `{system.strip()}`\n"
            + "- Glassbox: prefill over the whole prompt, then decode_step with one KVCache per token, "
            + "greedy; torch.set_num_threads(threads); bf16 and int8 through "
            + "webapp.chat.model.precision.apply_precision where it exists\n"
            + f"- decode tok/s = {args.new} single-token steps / their seconds (prefill, the first token's argmax "
            + f"included, is timed apart); {args.reps} reps, medians (and each rep's own ratio: "
            + "its median and range); within a rep the variants take turns of "
            + (f"{args.slice} steps each (the order reversed at every turn)" if args.slice else "a whole run each")
            + "; prompts of random "
            + "GPT-2 ids (bench.common.prompt_ids)\n"
            + "- the pairs are alike, not the same: llama.cpp's GPT-2 graph uses the tanh GELU (through an fp16 "
            + "table), Glassbox and the exported config the exact erf GELU, so the logits differ a little even "
            + "at fp32; f16 vs bfloat16 weights; q8_0 = int8 blocks of 32 weights with a scale each and int8 "
            + "activations, Glassbox int8 = int8 weights with one scale per row and (decoding) int8 activations "
            + "in blocks of 32; Glassbox bf16 = bfloat16 weights (7 mantissa bits, f16 has 10) and float32 "
            + "activations; Glassbox bf16 and int8 keep a bfloat16 KV cache, fp32 a float32 one. Random "
            + "weights give nearly flat logits, so greedy streams part at the first near tie\n"
            + "".join(f"- {n}\n" for n in dict.fromkeys(notes))
            + "- other processes' CPU use during a timed run (/proc/stat less this benchmark's own): median "
            + f"{common.median(others):.2f} cores, at most {max(others, default=float('nan')):.2f}"
            + (" - the machine was not quiet: these timings are suspect" if max(others, default=0) > 0.25 else "")
            + "\n")
    common.report(f"Single-stream decode: Glassbox vs llama.cpp ({args.size})", body, load_before=load_before,
                  write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
