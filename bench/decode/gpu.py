"""The decode benchmark on a GPU (prepared for an H200): the 254M config in fp32 and bf16, absolute tokens/s
and the fraction of the memory roofline (bandwidth measured on the device, 8 GiB buffer).

    .venv/bin/python -m bench.decode.gpu             # on a machine with CUDA torch and a GPU
    .venv/bin/python -m bench.decode.gpu --dry-run   # the same code path on the CPU with a tiny config

What it runs: bench.decode.decoders with --device cuda --sizes gpt2-254m --prompts 300,800 --new 200 --reps 5, the
variants glassbox (fp32), glassbox-bf16 and transformers (fp32); then bench.decode.batch_step in bf16 for
batches 1 to 64 (the batched decoder's step, each row with its own cache). The seed loop is left out
(minutes of prefills for nothing new). TF32 stays off, so fp32 means fp32. Results are appended to
docs/benchmarks-history.md like every bench.

On a GPU a 254M decode step is launch-bound, not bandwidth-bound (about 300 small kernels per token, each
a few microseconds to launch from Python): expect eager decoding far below the roofline, and batching to
gain almost in proportion to the rows until the step turns bandwidth- or compute-bound.
"""

from __future__ import annotations

import sys

import torch

from bench.decode import batch_step, decoders

GPU_ARGS = ["--device", "cuda", "--sizes", "gpt2-254m", "--prompts", "300,800", "--new", "200", "--reps", "5",
            "--variants", "glassbox,glassbox-bf16,hf"]
BATCH_ARGS = ["--device", "cuda", "--dtype", "bfloat16", "--batches", "1", "2", "4", "8", "16", "32", "64"]
# The same path on the CPU, tiny: 2 layers, 64 wide (the 50304-token head still dominates), short prompts.
DRY_ARGS = ["--device", "cpu", "--sizes", "gpt2-254m", "--config", "2,2,64", "--prompts", "32,64", "--new", "8",
            "--reps", "1", "--variants", "glassbox,glassbox-bf16,hf", "--no-doc"]
DRY_BATCH_ARGS = ["--device", "cpu", "--dtype", "bfloat16", "--size", "gpt2", "--batches", "1", "2", "4",
                  "--context", "16", "--steps", "1", "--no-doc"]


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:  # its options are bench.decode.decoders' (the rest go there)
        print(__doc__)
        return None
    if "--dry-run" in argv:
        argv.remove("--dry-run")
        decoders.main(DRY_ARGS + argv)
        return batch_step.main(DRY_BATCH_ARGS)
    if not torch.cuda.is_available():
        sys.exit("no CUDA device visible to torch (this venv pins the CPU build: install a CUDA build of "
                 "torch 2.13 on the GPU machine), or use --dry-run")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    decoders.main(GPU_ARGS + argv)
    return batch_step.main(BATCH_ARGS)


if __name__ == "__main__":
    main()
