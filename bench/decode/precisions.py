"""Decode speed by precision and kernel, and what the reduced precisions change: one stream through the
app's generator (webapp.chat.decode.generate), the 254M shape, random GPT-2-init weights.

    .venv/bin/python -m bench.decode.precisions                        # 1 and 2 threads, 800-token prompt
    .venv/bin/python -m bench.decode.precisions --threads 2 --reps 1 --new 50 --no-doc   # a quick look

Variants, interleaved in every repetition: float32, bfloat16 (weights; float32 activations) and int8
(one scale per output row; the kernel multiplies by int8 activations, torch's by bfloat16 ones), each
decoded with Glassbox's kernel (webapp/chat/model/kernels) and with torch's kernels (`kernels.disabled()`,
the path taken where no C compiler is found). Figures are medians over --reps. Greedy agreement: the
greedy reply of each variant against float32 with the kernel (the exact reference), as the first token
that differs and the share of equal positions. Beside every rate its roofline (bench.rooflines.roofline: the
read bandwidth measured at that thread count in every repetition, median, ÷ the bytes a step of that
precision reads at the run's mean context) and the fraction of it reached.
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from bench import common, rooflines
from webapp.chat.decode.generate import generate
from webapp.chat.model import kernels
from webapp.chat.model.precision import apply_precision

PRECISIONS = ("float32", "bfloat16", "int8")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="gpt2-254m")
    p.add_argument("--context", type=int, default=800, help="prompt tokens")
    p.add_argument("--new", type=int, default=200, help="new tokens per reply")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def greedy(loaded, ids, new) -> list[int]:
    return [p.token for p in generate(loaded, ids, max_new_tokens=new, temperature=0) if p.token is not None]


def agreement(reply: list[int], reference: list[int]) -> tuple[int | None, float]:
    """(index of the first differing token or None, share of equal positions)."""
    first = next((i for i, (a, b) in enumerate(zip(reply, reference)) if a != b), None)
    return first, sum(a == b for a, b in zip(reply, reference)) / max(1, len(reference))


def main(argv=None):
    args = parse_args(argv)
    load_before = common.load_average()
    threads = [int(t) for t in args.threads.split(",")]
    models = {p: common.loaded(apply_precision(common.random_gpt(args.size), p)) for p in PRECISIONS}
    ids = common.prompt_ids(args.context)
    variants = [(p, kernel) for p in PRECISIONS for kernel in (True, False)]
    rates = {(t, v): [] for t in threads for v in variants}
    ttfts = {(t, v): [] for t in threads for v in variants}
    bandwidths: dict[int, list[float]] = {t: [] for t in threads}
    with torch.inference_mode():
        for rep in range(args.reps):
            for t in threads:
                torch.set_num_threads(t)
                bandwidths[t].append(rooflines.read_bandwidth_gbs())
                for precision, kernel in variants:
                    with contextlib.nullcontext() if kernel else kernels.disabled():
                        run = common.glassbox(models[precision], ids, args.new, top_k=50, seed=rep)
                    rates[(t, (precision, kernel))].append(run.tokens_per_s)
                    ttfts[(t, (precision, kernel))].append(run.ttft_s)
                    print(f"rep {rep} threads {t} {precision} {'kernel' if kernel else 'torch'}: "
                          f"{run.tokens_per_s:.1f} tok/s, TTFT {run.ttft_s:.2f} s", flush=True)
        torch.set_num_threads(max(threads))
        reference = greedy(models["float32"], ids, args.new)
        agree = {}
        for precision, kernel in variants:
            with contextlib.nullcontext() if kernel else kernels.disabled():
                agree[(precision, kernel)] = agreement(greedy(models[precision], ids, args.new), reference)

    header = ["precision", "kernel"]
    for t in threads:
        header += [f"{t} thr tok/s", f"{t} thr roofline tok/s", f"{t} thr fraction of roofline"]
    header += [f"{t} thr × fp32 torch" for t in threads]
    header += [f"TTFT {max(threads)} thr (s)", "first greedy token ≠ fp32", "greedy tokens = fp32"]
    bandwidth = {t: common.median(bandwidths[t]) for t in threads}
    steps = {p: rooflines.step_bytes(models[p].model, [rooflines.mean_context(args.context, args.new - 1)])
             for p in PRECISIONS}
    rows = []
    for v in variants:
        med = [common.median(rates[(t, v)]) for t in threads]
        base = [common.median(rates[(t, ("float32", False))]) for t in threads]
        first, share = agree[v]
        cells = []
        for t, rate in zip(threads, med):
            cells += [rate, *rooflines.roofline(rate, steps[v[0]], bandwidth[t])]
        rows.append([v[0], "glassbox" if v[1] else "torch", *cells, *[m / b for m, b in zip(med, base)],
                     common.median(ttfts[(max(threads), v)]), "none" if first is None else first, f"{share:.0%}"])
    body = (common.table(header, rows)
            + f"\n\n- {args.size}, random GPT-2-init weights, {args.context}-token prompt, {args.new} new tokens "
            + f"(top-k 50 for speed, greedy for agreement), medians of {args.reps} interleaved repetitions; "
            + "kernel: `glassbox` = webapp/chat/model/kernels "
            + f"({'compiled' if kernels.library() else 'unavailable: ' + str(kernels.unavailable_reason)}), "
            + "`torch` = torch's kernels (oneDNN, torch's weight-only int8).\n"
            + "- bytes a step reads: " + ", ".join(f"{p} {b / 2**20:.0f} MiB" for p, b in steps.items()) + "\n"
            + rooflines.roofline_note(bandwidth, bandwidths))
    common.report(f"bench.decode.precisions: {args.size}, decode by precision and kernel", body,
                  load_before=load_before, write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
