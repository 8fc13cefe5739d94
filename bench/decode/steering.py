"""Steering: what a steered row costs in the batched decode step, against a plain one.

    .venv/bin/python -m bench.decode.steering                        # GPT-2 small shape, float32
    .venv/bin/python -m bench.decode.steering --size gpt2-254m --batch 8 --no-doc

On a random model of that shape: the decode step of B rows (each its own cache, 300 positions in), all plain,
and with one row steered (α·v added after the middle block: the row stays on the fused block kernel, the add
made after its call), interleaved reps, medians; and one reply alone, plain and steered.
"""

from __future__ import annotations

import argparse
import time

import torch

from bench import common


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="gpt2")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=300, help="positions in each row's cache")
    p.add_argument("--steps", type=int, default=20, help="decode steps per rep")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


@torch.inference_mode()
def step_seconds(model, rows: int, prompt: int, steps: int, edits) -> float:
    from webapp.chat.model.gpt import Chunk
    ids = common.prompt_ids(prompt)
    caches = []
    for r in range(rows):
        cache = model.new_cache(max_len=prompt + steps + 1)
        model.prefill([Chunk(ids, cache, 0, logits=False, edit=edits[r])])
        caches.append(cache)
    idx = torch.tensor([[ids[-1]]] * rows)
    started = time.perf_counter()
    for s in range(steps):
        model.decode_step(idx, caches, [prompt + s] * rows, edits)
    return (time.perf_counter() - started) / steps


def main(argv=None):
    args = parse_args(argv)
    from webapp.chat.model.steer import Term, steer_edit
    load_before = common.load_average()
    model = common.random_gpt(args.size)
    C, L = model.config.n_embd, model.config.n_layer
    vector = tuple(torch.randn(C, generator=torch.Generator().manual_seed(0)).tolist())
    steer = steer_edit([Term(L // 2, vector, 4.0)], "cpu", torch.float32)
    cases = {"plain": [None] * args.batch, "one row steered": [steer] + [None] * (args.batch - 1),
             "alone, plain": [None], "alone, steered": [steer]}
    times: dict[str, list[float]] = {name: [] for name in cases}
    step_seconds(model, 1, args.prompt, 2, [None])  # warm-up
    for _ in range(args.reps):
        for name, edits in cases.items():
            times[name].append(step_seconds(model, len(edits), args.prompt, args.steps, edits))
    rows = [[name, len(cases[name]), 1000 * common.median(t),
             common.median(t) / common.median(times["plain" if len(cases[name]) > 1 else "alone, plain"])]
            for name, t in times.items()]
    body = (common.table(["decode step", "rows", "ms (median)", "× plain"], rows)
            + f"\n\n- model: random {args.size}, float32; {args.prompt} positions in each row's cache, "
              f"{args.steps} steps a rep, {args.reps} interleaved reps; a direction after block {L // 2}, α = 4")
    common.report(f"Steering, {args.size}", body, load_before=load_before, write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
