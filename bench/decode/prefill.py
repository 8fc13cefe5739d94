"""Prefill speed by precision: prompt tokens per second of one prompt run through the model's prefill (the
keys and values of every position, the logits of the last), float32 against bfloat16 and int8 on the same
random weights, and with --profile where each precision's prefill spends its time, by operator.

    .venv/bin/python -m bench.decode.prefill                          # 254M, a 512-token prompt, 1 and 2 threads
    .venv/bin/python -m bench.decode.prefill --prompts 16,512         # a follow-up turn's few new tokens too
    .venv/bin/python -m bench.decode.prefill --threads 1 --reps 3 --profile --no-doc   # a quick look

Every repetition runs each precision once, interleaved, so the ratios share the machine's load; each figure
is the best of --reps (the least disturbed run on a shared machine), and the median is printed beside it.
The prompt is one chunk, as webapp.chat.decode.generate runs a prompt of up to prefill_chunk() tokens.
Variant `int8-torch`: the same int8 model prefilling through torch's weight-only int8 kernel
(WeightOnlyLinear.decode_matmul: int8 prefill's path before issue 34, and still a decode step's without
Glassbox's kernel), for the change side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from unittest import mock

import torch

from bench import common
from webapp.chat.model.gpt import Chunk
from webapp.chat.model.precision import WeightOnlyLinear, apply_precision

PRECISIONS = ("float32", "bfloat16", "int8", "int8-torch")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="gpt2-254m")
    p.add_argument("--prompts", default="512", help="prompt lengths in tokens")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--profile", action="store_true", help="also print each precision's operators (one prefill)")
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def path(variant: str):
    """The context a variant prefills in: int8-torch's layers multiply as a decode step without the kernel."""
    if variant == "int8-torch":
        return mock.patch.object(WeightOnlyLinear, "matmul", WeightOnlyLinear.decode_matmul)
    return contextlib.nullcontext()


def prefill_seconds(model, ids: list[int]) -> float:
    """One cold prefill of `ids` into a new cache (the last position's logits included) -> seconds."""
    cache = model.new_cache(1, len(ids))
    chunk = Chunk(ids, cache, 0, logits=True)
    t = time.perf_counter()
    model.prefill([chunk])
    return time.perf_counter() - t


def profile(model, ids: list[int], precision: str) -> str:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof, path(precision):
        prefill_seconds(model, ids)
    top = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8)
    return f"\n{precision}:\n{top}"


def main(argv=None):
    args = parse_args(argv)
    load_before = common.load_average()
    threads = [int(t) for t in args.threads.split(",")]
    precisions = args.precisions.split(",")
    models = {p: apply_precision(common.random_gpt(args.size), p.removesuffix("-torch")) for p in precisions
              if p != "int8-torch" or "int8" not in precisions}
    models.setdefault("int8-torch", models.get("int8"))
    lengths = [int(n) for n in args.prompts.split(",")]
    seconds: dict[tuple[int, int, str], list[float]] = {(t, n, p): [] for t in threads for n in lengths
                                                        for p in precisions}
    profiles = []
    with torch.inference_mode():
        for p in precisions:  # warm every path (allocator, oneDNN's primitive cache) before timing
            for n in lengths:
                with path(p):
                    prefill_seconds(models[p], common.prompt_ids(n))
        for rep in range(args.reps):
            for t in threads:
                torch.set_num_threads(t)
                for n in lengths:
                    ids = common.prompt_ids(n)
                    for p in precisions:
                        with path(p):
                            seconds[(t, n, p)].append(prefill_seconds(models[p], ids))
                    print(f"rep {rep} threads {t} prompt {n}: " + ", ".join(
                        f"{p} {n / seconds[(t, n, p)][-1]:.0f} tok/s" for p in precisions), flush=True)
        if args.profile:
            torch.set_num_threads(max(threads))
            profiles = [profile(models[p], common.prompt_ids(max(lengths)), p) for p in precisions]
    rows = []
    for n in lengths:
        for p in precisions:
            best = [n / min(seconds[(t, n, p)]) for t in threads]
            med = [n / common.median(seconds[(t, n, p)]) for t in threads]
            vs = {q: [b / (n / min(seconds[(t, n, q)])) for t, b in zip(threads, best)] for q in precisions[:2]}
            rows.append([n, p, *best, *med, *(x for q in precisions[:2] for x in vs[q])])
    header = (["prompt", "precision"] + [f"{t} thr tok/s (best)" for t in threads]
              + [f"{t} thr tok/s (median)" for t in threads]
              + [f"{t} thr × {q} (best)" for q in precisions[:2] for t in threads])
    body = (common.table(header, rows)
            + f"\n\n- {args.size}, random GPT-2-init weights, each prompt prefilled cold in one chunk into a new "
            + f"cache, logits of its last position; best and median of {args.reps} repetitions, precisions "
            + "interleaved in each.\n" + "".join(profiles))
    common.report(f"bench.decode.prefill: {args.size}, prefill by precision", body, load_before=load_before,
                  write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
