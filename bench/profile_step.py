"""Where one decode step's time goes: torch's profiler over Glassbox's KV-cached step, by operator, with the
bandwidth each weight-reading operator reached.

    .venv/bin/python -m bench.profile_step                       # 254M, fp32, 800 cached positions
    .venv/bin/python -m bench.profile_step --dtype bfloat16 --context 300 --no-doc
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench import common


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="gpt2-254m")
    p.add_argument("--context", type=int, default=800, help="positions already in the KV cache")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    load_before = common.load_average()
    model = common.random_gpt(args.size, dtype=getattr(torch, args.dtype))
    ids = torch.tensor([common.prompt_ids(args.context)])
    cache = model.new_cache()
    token = ids[:, :1]
    with torch.inference_mode():
        model.forward_cached(ids, cache, 0)
        for i in range(3):
            model.forward_cached(token, cache, args.context + i)
        times = []
        for i in range(args.steps):
            t = time.perf_counter()
            model.forward_cached(token, cache, args.context + 3 + i)
            times.append(time.perf_counter() - t)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(args.steps):
                model.forward_cached(token, cache, args.context + 3 + args.steps + i)
    step_ms = common.median(times) * 1e3
    cfg, size = model.config, torch.tensor([], dtype=model.lm_head.weight.dtype).element_size()
    layer_bytes = cfg.n_layer * 12 * cfg.n_embd**2 * size  # c_attn 3C², c_proj C², c_fc 4C², mlp c_proj 4C²
    head_bytes = cfg.vocab_size * cfg.n_embd * size
    kv_bytes = cfg.n_layer * 2 * args.context * cfg.n_embd * size
    reads = {"aten::addmv": layer_bytes, "aten::addmm": layer_bytes, "aten::addmv_": head_bytes, "aten::mm": head_bytes,
             "aten::_scaled_dot_product_flash_attention_for_cpu": kv_bytes}
    rows = []
    for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:10]:
        ms = e.self_cpu_time_total / 1e3 / args.steps
        gbs = reads[e.key] / (ms / 1e3) / 1e9 if e.key in reads else float("nan")
        rows.append([e.key, e.count // args.steps, ms, gbs])
    body = (common.table(["operator", "calls per step", "ms per step (self)", "GB/s it read"], rows)
            + f"\n\n- {args.size} in {args.dtype}, {args.context} cached positions: one step takes {step_ms:.1f} ms "
            + f"(median of {args.steps}, outside the profiler) = {1e3 / step_ms:.1f} tokens/s. Bytes read per step: "
            + f"layer weights {layer_bytes / 1e6:.0f} MB, lm_head {head_bytes / 1e6:.0f} MB, keys and values "
            + f"{kv_bytes / 1e6:.0f} MB; addmv/addmm rows are the layers' matrices, addmv_ (torch.mv) or mm the "
            + "lm_head, the attention row the KV cache. The profiler adds its own overhead to the small operators.\n")
    common.report(f"Decode step profile: {args.size}, {args.dtype}, {args.context} positions", body,
                  load_before=load_before, write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
