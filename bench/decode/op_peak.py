"""How fast the AVX2 kernels' arithmetic alone can go: the multiply-adds a second of each precision's instruction
sequence on one core, everything in registers, and what that caps a decode step at, whatever the batch size.

    .venv/bin/python -m bench.decode.op_peak                        # gpt2-254m, 2 threads
    .venv/bin/python -m bench.decode.op_peak --size gpt2 --threads 1 --no-doc

bench/decode/op_peak.c is the harness (compiled here with -march=native; it needs AVX2 and FMA). A decode step
does one multiply-add per weight of its linear layers (lm_head included) per row; once a batch is large enough
that the weights' reading is shared, that arithmetic is the bound: tokens/s ≤ threads × rate ÷ multiply-adds
per token, before attention and everything else. int8 is the sign trick on 32 weights (llama.cpp's q8_0 runs
the same sequence on AVX2); bfloat16 is a lone row's sequence (a batch widens each weight once for several
rows, and then runs at float32's rate).
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from bench import common
from webapp.chat.model import kernels
from webapp.chat.model.gpt import PRESETS, GPTConfig

HARNESS = Path(__file__).with_name("op_peak.c")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="gpt2-254m", choices=sorted(PRESETS))
    p.add_argument("--threads", type=int, default=2, help="cores the ceiling counts (each at one core's rate)")
    p.add_argument("--iterations", type=int, default=50_000_000, help="iterations of each way per run")
    p.add_argument("--rounds", type=int, default=3, help="runs of the harness, the median taken")
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def multiply_adds_per_token(config: GPTConfig) -> int:
    """One per weight of every linear layer a decode step runs: per block the query/key/value projection (3 C²),
    attention's output (C²) and the MLP's two (4 C² each); then lm_head (vocab × C)."""
    c = config.n_embd
    return config.n_layer * 12 * c * c + config.vocab_size * c


def run(binary: Path, iterations: int) -> dict[str, float]:
    """-> {way: GMAC/s on one core} from one run of the harness"""
    out = subprocess.run([str(binary), str(iterations), "3"], capture_output=True, text=True, check=True)
    rates = {}
    for line in out.stdout.splitlines():
        kind, name, value = line.split()
        if kind == "rate":
            rates[name] = float(value)
    return rates


def main(argv=None) -> int:
    args = parse_args(argv)
    flags = kernels._cpu_flags().split()
    if "avx2" not in flags or "fma" not in flags:
        print("bench.decode.op_peak needs AVX2 and FMA (this CPU lacks one)")
        return 1
    load_before = common.load_average()
    with common.native_harness(HARNESS, "-O2") as binary:
        runs = [run(binary, args.iterations) for _ in range(args.rounds)]
    macs = multiply_adds_per_token(PRESETS[args.size])
    rows = []
    for name in runs[0]:
        rate = common.median([r[name] for r in runs])
        rows.append([name, f"{rate:.2f}", f"{args.threads * rate * 1e9 / macs:.1f}"])
    note = ("" if "avx512f" not in flags else
            "\n\nThis CPU has AVX-512: the decode kernels' AVX2 sequences above; float32-avx512 and bfloat16-dpbf16 "
            "are the ways oneDNN's prefill multiplies here (bench.decode.prefill_peak divides by them).")
    body = (f"One core's multiply-adds a second in each precision's AVX2 sequence, in registers (best of 3 runs of "
            f"{args.iterations:,} iterations, median of {args.rounds} runs); the ceiling it puts on a decode step of "
            f"{args.size} ({macs / 1e6:.1f}M multiply-adds a token in its linear layers) at {args.threads} threads, "
            "for any batch size, before attention.\n\n"
            + common.table(["precision", "GMAC/s, one core", f"tokens/s ceiling, {args.threads} threads"], rows)
            + note)
    common.report(f"bench.decode.op_peak: {args.size}", body, load_before=load_before, write_doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
