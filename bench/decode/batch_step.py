"""One batched decode step: time per step and tokens/s for batch sizes 1..64, each row with its own
KV cache at its own position (as the core's batched decoder runs them), whether every row's logits
are the same, bit for bit, as that row decoded alone, and what each token's odds (webapp/chat/decode/odds.py,
computed for the whole batch after sampling) add to a step.

    .venv/bin/python -m bench.decode.batch_step                          # 254M, fp32, CPU, batches 1 2 4 8 16
    .venv/bin/python -m bench.decode.batch_step --dtype int8             # a precision of webapp/chat/model/precision.py
    .venv/bin/python -m bench.decode.batch_step --dtype bfloat16 --device cuda --batches 1 2 4 8 16 32 64

On the CPU each batch size runs with Glassbox's decode kernel and with torch's (`kernels.disabled()`, the
fallback and the path before the kernel), interleaved, so the kernel's single-stream gain can be checked
against what it does to the batch.

This is what GLASSBOX_MAX_BATCH's default is chosen from (docs/benchmarks.md): past some batch size a
step costs more than the rows it adds. Beside every rate its roofline (bench.rooflines.roofline): B × the read
bandwidth (measured before and after, the better) ÷ the bytes a step of B rows reads (the weights once, each
row's keys and values at its own context).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import torch

from bench import common, rooflines
from webapp.chat.decode.odds import token_odds
from webapp.chat.model import kernels
from webapp.chat.model.gpt import Chunk
from webapp.chat.model.precision import apply_precision


def kernel(path: str):
    """The decode kernels a run uses: `glassbox` (webapp/chat/model/kernels) or `torch` (kernels.disabled())."""
    return contextlib.nullcontext() if path == "glassbox" else kernels.disabled()


def caches_for(model, batch: int, context: int, device):
    """`batch` sequences, each prefilled with its own `context`-ish tokens (lengths differ by row)."""
    caches, positions, last = [], [], []
    for r in range(batch):
        ids = common.prompt_ids(context + 7 * r, seed=r)
        cache = model.new_cache(1, model.config.block_size)
        with torch.inference_mode():
            model.prefill([Chunk(ids[:-1], cache, 0, logits=False)])
        caches.append(cache)
        positions.append(len(ids) - 1)
        last.append(ids[-1])
    return torch.tensor(last, device=device).view(-1, 1), caches, positions


def measure(model, idx, caches, positions, batch: int, steps: int, device="cpu", odds: bool = True):
    """`steps` timed decode steps of the first `batch` rows (after one warm-up), each row at its own
    position (the same step again each time: the caches keep their context) -> (seconds per step, seconds
    of each step's odds (empty without `odds`), the last step's logits)."""
    times, odds_times = [], []
    with torch.inference_mode():
        for step in range(steps + 1):  # the first is a warm-up
            common.sync(device)
            t = time.perf_counter()
            logits = model.decode_step(idx[:batch], caches[:batch], positions[:batch])
            common.sync(device)
            if step:
                times.append(time.perf_counter() - t)
            if odds:
                t = time.perf_counter()  # the odds as the app records them: top-k 50, temperature 1
                token_odds(logits, logits.argmax(-1), [1.0] * batch, [50] * batch)
                if step:
                    odds_times.append(time.perf_counter() - t)
    return times, odds_times, logits


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="gpt2-254m")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--context", type=int, default=300, help="tokens already in each row's cache")
    p.add_argument("--steps", type=int, default=5, help="timed steps per batch size (median)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before, device = common.load_average(), torch.device(args.device)
    model = apply_precision(common.random_gpt(args.size, seed=0, device=device), args.dtype)
    idx, caches, positions = caches_for(model, max(args.batches), args.context, device)
    paths = ["glassbox", "torch"] if device.type == "cpu" else ["torch"]
    bandwidths = [rooflines.read_bandwidth_gbs(device=device)]
    alone = {}
    for path in paths:
        with torch.inference_mode(), kernel(path):
            alone[path] = [model.decode_step(idx[r:r + 1], [caches[r]], [positions[r]]) for r in range(len(caches))]
    rows = []
    for batch in args.batches:
        for path in paths:
            with kernel(path):
                times, odds_times, logits = measure(model, idx, caches, positions, batch, args.steps, device)
            same = all(torch.equal(logits[r:r + 1], alone[path][r]) for r in range(batch))
            step, odds = common.median(times), common.median(odds_times)
            rows.append([path, batch, step * 1000, batch / step, "yes" if same else "no", odds * 1000, odds / step])
            print(rows[-1], flush=True)
    bandwidths.append(rooflines.read_bandwidth_gbs(device=device))
    bandwidth = max(bandwidths)
    base = {path: next(r[3] for r in rows if r[0] == path) for path in paths}
    for row in rows:
        batch = row[1]
        step = rooflines.step_bytes(model, [positions[r] + 1 for r in range(batch)])
        row[4:4] = [row[3] / base[row[0]], *rooflines.roofline(row[3], step, bandwidth, rows=batch)]
    body = (f"{args.size}, {args.dtype} on {args.device}, {args.context}+ tokens in each row's cache, "
            f"median of {args.steps} steps; kernel `glassbox`: webapp/chat/model/kernels, `torch`: torch's kernels.\n\n"
            + common.table(["kernel", "batch", "ms per step", "tokens/s", "tokens/s vs batch 1", "roofline tokens/s",
                            "fraction of roofline", "rows equal alone, bit for bit", "odds ms", "odds / step"], rows)
            + "\n\n" + rooflines.roofline_note({torch.get_num_threads(): bandwidth}))
    common.report(f"bench.decode.batch_step: {args.size} {args.dtype} {args.device}", body, load_before=load_before,
                  write_doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
