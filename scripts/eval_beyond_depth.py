"""Beyond the trained depth: run looped models for many loops whatever their heads say, and report where
their letters first go wrong and whether their state settles onto the table's cycle.

    .venv/bin/python scripts/eval_beyond_depth.py --model models/loops-latent --loops 999 --tables 200

Random-function tables (held-out seed); every run is forced to --loops loops. Per model: how many runs are
still right at loops 32, 100, 256 and --loops, and, for the state the model hands over (loop_state), how
far h_t is from h_{t+p} (p the period of the cycle the table's walk falls into) as a fraction of ‖h_t‖:
0 means the state comes back exactly to where it was a cycle ago, a periodic orbit, whatever the loop
(over the runs still right at the last loop).
"""

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from webapp.loops.model.checkpoint import load_bundle  # noqa: E402
from webapp.loops.task import SYMBOLS, execute, preset, render_prompt  # noqa: E402

CHECKS = (32, 100, 256)


def cycle_entry(mapping: dict, start: str) -> tuple[int, int]:
    """-> (the loop from which the walk is on its cycle, the cycle's period)."""
    seen, x, loop = {start: 0}, start, 0
    while True:
        x, loop = mapping[x], loop + 1
        if x in seen:
            return max(seen[x], 1), loop - seen[x]
        seen[x] = loop


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="bundle directory (repeat for several)")
    parser.add_argument("--loops", type=int, default=999)
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--seed", type=int, default=20_261_206)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{args.tables} random-function tables (seed {args.seed}), each forced to {args.loops} loops\n")
    checks = [c for c in CHECKS if c < args.loops] + [args.loops]
    print("| model | " + " | ".join(f"right to loop {c}" for c in checks)
          + " | largest ‖h_t − h_t+p‖/‖h_t‖ after loop 32 | after loop 100 |")
    print("|---" * (len(checks) + 3) + "|")
    for path in args.model or ["models/loops-latent"]:
        bundle, rng, began = load_bundle(path), random.Random(args.seed), time.time()
        right = dict.fromkeys(checks, 0)
        drift = {32: 0.0, 100: 0.0}
        for _ in range(args.tables):
            pairs, start = preset("function", rng), rng.choice(SYMBOLS)
            enc = bundle.tokenizer(render_prompt(pairs, start, 1), add_special_tokens=False, return_tensors="pt")
            states: list[torch.Tensor] = []
            with torch.inference_mode():
                out = bundle.model(input_ids=enc["input_ids"], num_loops=args.loops, completion_threshold=2.0,
                                   readout_token_ids=list(bundle.readout_token_ids), loop_state=True,
                                   loop_callback=lambda *a, state, kept=states: kept.append(state[0].double()))
            predicted = [SYMBOLS[i] for i in out.scores[0].argmax(-1).tolist()]
            expected = execute(dict(pairs), start, args.loops)
            wrong = next((i + 1 for i, (p, e) in enumerate(zip(predicted, expected)) if p != e), None)
            for c in checks:
                right[c] += wrong is None or wrong > c
            _, period = cycle_entry(dict(pairs), start)
            h = torch.stack(states)
            gaps = (h[period:] - h[:-period]).norm(dim=-1) / h[:-period].norm(dim=-1)   # [loops - p]
            for after in drift:  # on the table's own cycle only: a run gone wrong walks another one
                if wrong is None and gaps.numel() > after:
                    drift[after] = max(drift[after], float(gaps[after:].max()))
        cells = [f"{right[c] / args.tables:.3f}" for c in checks] + [f"{drift[32]:.2e}", f"{drift[100]:.2e}"]
        print(f"| {bundle.checkpoint_id} | " + " | ".join(cells) + f" |  ({time.time() - began:.0f} s)")


if __name__ == "__main__":
    main()
