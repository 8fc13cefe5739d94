"""Where one decode step's time goes: torch's profiler over Glassbox's KV-cached step, by operator, with the
bandwidth each weight-reading operator reached.

    .venv/bin/python -m bench.decode.profile_step                       # 254M, fp32, 800 cached positions
    .venv/bin/python -m bench.decode.profile_step --dtype int8 --context 300 --threads 1 --no-doc

The step is the app's: GPT.decode_step on one row (webapp/chat/decode/generate.py decodes with it, alone or
batched), at a precision of webapp/chat/model/precision.py.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench import common
from webapp.chat.model.gpt import Chunk
from webapp.chat.model.precision import PRECISIONS, apply_precision


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="gpt2-254m")
    p.add_argument("--context", type=int, default=800, help="positions already in the KV cache")
    p.add_argument("--dtype", default="float32", help="a precision: float32, bfloat16, int8")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    load_before = common.load_average()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = apply_precision(common.random_gpt(args.size), args.dtype)
    ids = torch.tensor([common.prompt_ids(args.context)])
    cache = model.new_cache()
    token = ids[:, :1]
    with torch.inference_mode():
        model.prefill([Chunk(ids[0].tolist(), cache)])
        for i in range(3):
            model.decode_step(token, [cache], [args.context + i])
        times = []
        for i in range(args.steps):
            t = time.perf_counter()
            model.decode_step(token, [cache], [args.context + 3 + i])
            times.append(time.perf_counter() - t)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(args.steps):
                model.decode_step(token, [cache], [args.context + 3 + args.steps + i])
        # torch's profiler does not see the decode kernel (a ctypes call): cProfile times its calls
        python = cProfile.Profile()
        python.enable()
        for i in range(args.steps):
            model.decode_step(token, [cache], [args.context + 3 + 2 * args.steps + i])
        python.disable()
    step_ms = common.median(times) * 1e3
    inside = {name: (stat[3], stat[1]) for (path, _, name), stat in pstats.Stats(python).stats.items()
              if "kernels" in path}  # name -> (seconds inside, calls)
    cfg, size = model.config, {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}[PRECISIONS[args.dtype]]
    kv_size = 4 if PRECISIONS[args.dtype] == "float32" else 2  # the reduced precisions keep keys and values in 16 bits
    layer_bytes = cfg.n_layer * 12 * cfg.n_embd**2 * size  # c_attn 3C², c_proj C², c_fc 4C², mlp c_proj 4C²
    head_bytes = cfg.vocab_size * cfg.n_embd * size
    kv_bytes = cfg.n_layer * 2 * args.context * cfg.n_embd * kv_size
    weights = layer_bytes + head_bytes  # every layer and lm_head go through one kernel
    reads = {"mkldnn::_linear_pointwise": weights, "aten::_weight_int8pack_mm": weights,
             "aten::_scaled_dot_product_flash_attention_for_cpu": kv_bytes}
    rows = []
    averages = prof.key_averages()
    calls = sum(e.count for e in averages) // args.steps
    for e in sorted(averages, key=lambda e: -e.self_cpu_time_total)[:10]:
        ms = e.self_cpu_time_total / 1e3 / args.steps
        gbs = reads[e.key] / (ms / 1e3) / 1e9 if e.key in reads else float("nan")
        rows.append([e.key, e.count // args.steps, ms, gbs])
    # the decode kernels, under cProfile: a whole block per call (its layers' weights and the KV cache), where
    # the kernel takes the block; else a call per linear layer and per row's attention. lm_head is a linear call.
    by_block = "block" in inside
    kernel_ms = 0.0
    for name, nbytes in (("linear", head_bytes if by_block else weights), ("attend", kv_bytes),
                         ("block", layer_bytes + kv_bytes)):
        if name in inside:
            seconds, count = inside[name]
            ms = seconds * 1e3 / args.steps
            kernel_ms += ms
            rows.insert(0, [f"kernels.{name} (webapp/chat/model/kernels)", count // args.steps, ms,
                            nbytes / (ms / 1e3) / 1e9])
    body = (common.table(["operator", "calls per step", "ms per step (self)", "GB/s it read"], rows)
            + f"\n\n- {args.size} in {args.dtype}, {args.context} cached positions: one step takes {step_ms:.1f} ms "
            + f"(median of {args.steps}, outside the profiler) = {1e3 / step_ms:.1f} tokens/s, {calls} operator calls. "
            + "Bytes read per step: "
            + f"layer weights {layer_bytes / 1e6:.0f} MB, lm_head {head_bytes / 1e6:.0f} MB, keys and values "
            + f"{kv_bytes / 1e6:.0f} MB; "
            + ("the block kernel's row reads the layers' matrices and the KV cache, the linear kernel's lm_head. "
               if by_block else "the linear kernel's row reads the layers' matrices and lm_head, the attention "
               "row the KV cache. ")
            + f"The kernels' calls take {kernel_ms:.1f} ms of the step under cProfile (their Python wrappers "
            + "included), which leaves about " + f"{max(step_ms - kernel_ms, 0):.1f} ms for everything else. "
            + "The kernels' rows are timed with cProfile (torch's profiler does not see "
            + "a ctypes call), the operators' with torch's profiler, which adds its own overhead to the small ones.\n")
    common.report(f"Decode step profile: {args.size}, {args.dtype}, {args.context} positions, "
                  f"{torch.get_num_threads()} threads", body,
                  load_before=load_before, write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
