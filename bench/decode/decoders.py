"""Decode speed: the seed's full-recompute loop vs Glassbox's generator vs transformers' generate, on
the same random weights, against the machine's memory roofline.

    .venv/bin/python -m bench.decode.decoders                       # GPT-2 small and 254M, prompts 300 and 800
    .venv/bin/python -m bench.decode.decoders --sizes gpt2 --prompts 300 --reps 1 --no-doc   # a quick look

Variants run interleaved (seed, glassbox, hf, glassbox-bf16, seed, glassbox, ...) and each figure is
the median over --reps. The seed loop pays a whole prefill per token, so it makes only --seed-new
tokens (its rate is per token all the same). Roofline = measured read bandwidth / bytes one decode step
reads (weights, and the KV cache at the mean context of the run's steps: bench.rooflines.roofline); bandwidth
is measured before every round and the median is used.
"""

from __future__ import annotations

import argparse

import torch

from bench import common, rooflines
from webapp.chat.model.precision import apply_precision


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="gpt2,gpt2-254m", help="presets of webapp.chat.model.gpt.PRESETS")
    p.add_argument("--prompts", default="300,800", help="prompt lengths in tokens")
    p.add_argument("--new", type=int, default=200, help="new tokens for glassbox and transformers")
    p.add_argument("--seed-new", type=int, default=12, help="new tokens for the seed loop (slow)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--variants", default="seed,glassbox,hf,glassbox-bf16")
    p.add_argument("--device", default="cpu")
    p.add_argument("--config", default="", help="n_layer,n_head,n_embd: a custom size (dry runs)")
    p.add_argument("--no-doc", action="store_true", help="print only; do not append to docs/benchmarks-history.md")
    return p.parse_args(argv)


def build(size: str, args, device):
    if args.config:
        from webapp.chat.model import gpt
        n_layer, n_head, n_embd = map(int, args.config.split(","))
        gpt.PRESETS[size] = gpt.GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd)
    return common.random_gpt(size, seed=0, device=device)


def bench_size(size: str, args, device, bandwidths: list[float]):
    variants = args.variants.split(",")
    model = build(size, args, device)
    models = {"fp32": model}
    if "glassbox-bf16" in variants:
        models["bf16"] = apply_precision(common.random_gpt(size, seed=0, device=device), "bfloat16")
    hf = common.to_hf(model) if "hf" in variants else None
    check = common.check_same_logits(model, hf) if hf is not None else float("nan")
    loaded = {k: common.loaded(m) for k, m in models.items()}
    # F821 below is a false positive: the runners are called only before the `del` at the end of this function
    runners = {
        "seed": lambda ids, r: common.seed_loop(model, ids, args.seed_new, seed=r),  # noqa: F821
        "glassbox": lambda ids, r: common.glassbox(loaded["fp32"], ids, args.new, seed=r),  # noqa: F821
        "hf": lambda ids, r: common.hf_generate(hf, ids, args.new, seed=r),  # noqa: F821
        "glassbox-bf16": lambda ids, r: common.glassbox(loaded["bf16"], ids, args.new, seed=r),  # noqa: F821
    }
    # warm every path once (allocator, lazy init, oneDNN primitive caches) before timing
    for v in variants:
        runners[v](common.prompt_ids(40), 0) if v != "seed" else common.seed_loop(model, common.prompt_ids(40), 2)

    results = {}
    for length in map(int, args.prompts.split(",")):
        ids = common.prompt_ids(length, seed=length)
        runs = {v: [] for v in variants}
        for r in range(args.reps):
            gib = 2.0 if device.type == "cpu" else 8.0
            bandwidths.append(rooflines.read_bandwidth_gbs(gib, reps=3, device=device))
            for v in variants:
                common.sync(device)
                runs[v].append(runners[v](ids, r))
                common.sync(device)
            print(f"  {size} prompt {length} rep {r + 1}: " + ", ".join(
                f"{v} {runs[v][-1].tokens_per_s:.2f} tok/s ttft {runs[v][-1].ttft_s:.2f}s" for v in variants),
                flush=True)
        # bytes a step reads: the variant's own weights (the seed loop and transformers: float32's) and its
        # KV cache at the mean context of the run's decode steps
        results[length] = {v: (common.median(x.ttft_s for x in rs), common.median(x.tokens_per_s for x in rs),
                               rs[0].new_tokens,
                               rooflines.step_bytes(models["bf16" if v == "glassbox-bf16" else "fp32"],
                                                 [rooflines.mean_context(length, rs[0].new_tokens - 1)]))
                           for v, rs in runs.items()}
    sizes = {"fp32": rooflines.weight_bytes_per_token(model)}
    n_params = model.num_params()
    del hf, models, loaded, model
    return results, sizes, n_params, check


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    load_before = common.load_average()
    bandwidths: list[float] = []
    rows, notes = [], []
    for size in args.sizes.split(","):
        results, nbytes, n_params, check = bench_size(size, args, device, bandwidths)
        notes.append(f"{size}: {n_params / 1e6:.1f}M parameters, {nbytes['fp32'] / 1e9:.3f} GB of fp32 weights "
                     "read per token"
                     + (f"; transformers' logits differ from ours by at most {check:.1e}" if check == check else "")
                     )
        bw = common.median(bandwidths) if bandwidths else float("nan")
        for length, by_variant in results.items():
            ours = by_variant.get("glassbox", (float("nan"),) * 4)
            fp32_bytes = by_variant.get("glassbox", by_variant.get("seed", (0, 0, 0, float("nan"))))[3]
            for v, (ttft, rate, n, step) in by_variant.items():
                roof, fraction = rooflines.roofline(rate, step, bw)
                rows.append([size, length, v, n, ttft, rate, ours[1] / rate if v != "glassbox" else 1.0,
                             roof, fraction, rooflines.roofline(rate, fp32_bytes, bw)[1]])
    bw = common.median(bandwidths)
    header = ["model", "prompt", "variant", "new tokens", "TTFT s", "decode tok/s", "glassbox ÷ variant",
              "roofline tok/s (own dtype)", "fraction of own roofline", "fraction of fp32 roofline"]
    body = (common.table(header, rows) + "\n\n"
            + f"- memory read bandwidth (median of {len(bandwidths)} measurements, best of sum/mv over a buffer "
            + f"of {2 if device.type == 'cpu' else 8} GiB): "
            + f"{bw:.1f} GB/s\n- " + "\n- ".join(notes) + "\n"
            + f"- {args.reps} reps, variants interleaved, medians; prompts of random GPT-2 token ids; top-k 50, "
            + f"temperature 1; the seed loop makes {args.seed_new} tokens per run, the others {args.new}.\n")
    common.report("Decode: seed loop vs Glassbox vs transformers", body, load_before=load_before,
                  write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
