"""What the bfloat16 tile could gain from AVX-512 BF16's dot instruction, and what each way costs in accuracy:
the kernels' 6 x 4 tile on one thread, weights in L2 (no memory in the way), float32 and bfloat16 weights.

    .venv/bin/python -m bench.decode.tile_peak                      # K 1024, 128 weight rows (256 KB)
    .venv/bin/python -m bench.decode.tile_peak --k 4096 --n 32 --no-doc

bench/decode/tile_peak.c is the harness (compiled here with -march=native; it needs AVX-512, and AVX-512 BF16
for the two dot-instruction ways). Ways: `float32` (the float32 kernel's tile), `widened` (bfloat16 weights
widened to float32, as the bfloat16 kernel does today), `split` (vdpbf16ps with x as hi + lo bfloat16, the
numerics of AMX's tiles in webapp/chat/model/kernels/amx.c), `rounded` (vdpbf16ps with x rounded to
bfloat16), and for its error only `float16-x` (x rounded to float16 first, as llama.cpp's f16 weights meet
their activations). Error: |dot − exact| ÷ Σ|x w| over every output, against double precision.
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from bench import common
from webapp.chat.model import kernels

HARNESS = Path(__file__).with_name("tile_peak.c")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--k", type=int, default=1024, help="values of K (a multiple of 32)")
    p.add_argument("--n", type=int, default=128, help="weight rows (a multiple of 4; N * K * 4 bytes in L2)")
    p.add_argument("--reps", type=int, default=300, help="passes over the weights per way, best taken")
    p.add_argument("--rounds", type=int, default=3, help="runs of the harness (each interleaves the ways)")
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def run(binary: Path, k: int, n: int, reps: int) -> tuple[dict, dict]:
    """-> ({way: GFLOP/s}, {way: (mean error, worst error)}) from one run of the harness"""
    out = subprocess.run([str(binary), str(k), str(n), str(reps)], capture_output=True, text=True, check=True)
    rates, errors = {}, {}
    for line in out.stdout.splitlines():
        kind, name, *values = line.split()
        if kind == "rate":
            rates[name] = float(values[0])
        else:
            errors[name] = (float(values[0]), float(values[1]))
    return rates, errors


def main(argv=None) -> int:
    args = parse_args(argv)
    flags = kernels._cpu_flags().split()
    if "avx512f" not in flags or "f16c" not in flags:
        print("bench.decode.tile_peak needs AVX-512 and F16C (this CPU lacks one)")
        return 1
    load_before = common.load_average()
    with common.native_harness(HARNESS, "-O3", "-lm") as binary:
        runs = [run(binary, args.k, args.n, args.reps) for _ in range(args.rounds)]
    errors = runs[0][1]
    rates = {name: [r[0][name] for r in runs] for name in runs[0][0]}
    base = common.median(rates["widened"])
    rows = []
    for name, (mean, worst) in errors.items():
        rate = rates.get(name)
        rows.append([name, f"{common.median(rate):.1f}" if rate else "—",
                     f"{common.median(rate) / base:.2f}×" if rate else "—", f"{mean:.2e}", f"{worst:.2e}"])
    note = "" if "split" in rates else "\n\nNo AVX-512 BF16 (CPU or compiler): the dot-instruction ways did not run."
    body = (f"One thread, a 6 × 4 tile, x 6 rows, K = {args.k}, {args.n} weight rows ({args.n * args.k * 2 // 1024} "
            f"KB of bfloat16, twice that in float32: in L2), best of {args.reps} passes, median of {args.rounds} runs; "
            "the ways interleaved in each run. Error against double precision, relative to Σ|x w|.\n\n"
            + common.table(["way", "GFLOP/s", "vs widened", "mean error", "worst error"], rows) + note)
    common.report(f"bench.decode.tile_peak: K {args.k}, N {args.n}", body, load_before=load_before,
                  write_doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
