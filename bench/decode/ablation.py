"""Switching parts off: what an ablated reply and an ablation job cost, against the plain reply.

    .venv/bin/python -m bench.decode.ablation                        # GPT-2 small shape, float32
    .venv/bin/python -m bench.decode.ablation --size gpt2-254m --prompt 300 --new 32 --no-doc

On a random model of that shape, alone, interleaved reps (medians):
- a reply's decode rate plain, with two heads zeroed, and with two heads and an MLP mean-ablated (an edited
  row leaves the fused block kernel for the per-layer path, where the edit point is);
- a mean ablation's means: one clean forward of the prompt (webapp/chat/ablation/compute.py, clean_run);
- one position with parts switched off: the clean forward and the edited one (AblationJobs' work).
"""

from __future__ import annotations

import argparse
import time

import torch

from bench import common


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="gpt2")
    p.add_argument("--prompt", type=int, default=300, help="prompt tokens")
    p.add_argument("--new", type=int, default=32, help="new tokens per reply")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def decode_rate(loaded, ids, new, edit) -> float:
    from webapp.chat.decode.generate import generate
    stamps = [time.perf_counter() for piece in generate(loaded, ids, max_new_tokens=new, top_k=50, seed=0, edit=edit)
              if piece.stats is None]
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def main(argv=None):
    args = parse_args(argv)
    from webapp.chat.ablation.compute import clean_run, parse_parts, zero_edit
    from webapp.chat.ablation.jobs import AblationRequest, ablation_result
    load_before = common.load_average()
    model = common.random_gpt(args.size)
    loaded = common.loaded(model)
    n_layer, n_head = model.config.n_layer, model.config.n_head
    ids = common.prompt_ids(args.prompt)
    heads = f"{n_layer // 2}.0,{n_layer - 1}.{n_head - 1}"
    zero = zero_edit(parse_parts(heads, None, None, "zero", n_layer, n_head), n_head)
    mean_parts = parse_parts(heads, None, str(n_layer // 2), "mean", n_layer, n_head)
    mean = clean_run(model, ids, mean_parts).mean_edit()
    rates: dict[str, list[float]] = {"plain": [], "two heads zeroed": [], "two heads and an MLP mean-ablated": []}
    means_s, position_s = [], []
    decode_rate(loaded, ids, 4, None)  # warm-up
    for _ in range(args.reps):
        for name, edit in zip(rates, (None, zero, mean)):
            rates[name].append(decode_rate(loaded, ids, args.new, edit))
        started = time.perf_counter()
        clean_run(model, ids, mean_parts)
        means_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        with torch.inference_mode():
            ablation_result(loaded, AblationRequest(tuple(ids), mean_parts, position=True, token=ids[-1]))
        position_s.append(time.perf_counter() - started)
    plain = common.median(rates["plain"])
    rows = [[name, common.median(r), common.median(r) / plain] for name, r in rates.items()]
    body = (common.table(["reply", "decode tokens/s", "× plain"], rows)
            + "\n\n" + common.table(["ablation job", "seconds (median)"],
                                    [[f"mean ablation's means ({args.prompt} positions)", common.median(means_s)],
                                     [f"one position's odds, mean mode ({args.prompt} positions)",
                                      common.median(position_s)]])
            + f"\n\n- model: random {args.size}, float32; prompt {args.prompt} tokens, {args.new} new tokens per "
              f"reply, alone, {args.reps} interleaved reps; heads {heads}, MLP {n_layer // 2}")
    common.report(f"Switching parts off, {args.size}", body, load_before=load_before, write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
