"""Beyond the trained depth: run looped models for many loops whatever their heads say, and report where
their letters first go wrong and whether their state settles onto the table's cycle.

    .venv/bin/python scripts/eval_beyond_depth.py --model models/loops-latent --loops 999 --tables 200

Random-function tables (held-out seed); every run is forced to --loops loops. Per model: how many runs are
still right at loops 32, 100, 256 and --loops, and, for the state the model hands over (loop_state), how
far h_t is from h_{t+p} (p the period of the cycle the table's walk falls into) as a fraction of ‖h_t‖:
0 means the state comes back exactly to where it was a cycle ago, a periodic orbit, whatever the loop
(over the runs still right at the last loop). A second table per model: the loop block's attention entropy
over every loop (median, largest); how far loop 1's state is from where the next visit to the same letter
lands (runs that revisit it); and linear probes (webapp/loops/probe.py) reading x_t, x_t−1 and x_t−2 from
the states of the first --probe-loops loops, even tables training, odd ones held out.
"""

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from webapp.loops.model.checkpoint import load_bundle  # noqa: E402
from webapp.loops.probe import ProbeRun, decodability  # noqa: E402
from webapp.loops.states import attention_measures  # noqa: E402
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
    parser.add_argument("--probe-loops", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{args.tables} random-function tables (seed {args.seed}), each forced to {args.loops} loops\n")
    checks = [c for c in CHECKS if c < args.loops] + [args.loops]
    print("| model | " + " | ".join(f"right to loop {c}" for c in checks)
          + " | largest ‖h_t − h_t+p‖/‖h_t‖ after loop 32 | after loop 100 |")
    print("|---" * (len(checks) + 3) + "|")
    inside = []
    for path in args.model or ["models/loops-latent"]:
        bundle, rng, began = load_bundle(path), random.Random(args.seed), time.time()
        right = dict.fromkeys(checks, 0)
        drift = {32: 0.0, 100: 0.0}
        entropies: list[float] = []
        first_offsets: list[float] = []
        probe_runs: list[ProbeRun] = []
        for table in range(args.tables):
            pairs, start = preset("function", rng), rng.choice(SYMBOLS)
            enc = bundle.tokenizer(render_prompt(pairs, start, 1), add_special_tokens=False, return_tensors="pt")
            states: list[torch.Tensor] = []
            weights: list[list] = []

            def observe(*_, state, attention, kept=states, read=weights):
                kept.append(state[0].double())
                read.append(attention[0].tolist())
            with torch.inference_mode():
                out = bundle.model(input_ids=enc["input_ids"], num_loops=args.loops, completion_threshold=2.0,
                                   readout_token_ids=list(bundle.readout_token_ids), loop_state=True,
                                   loop_attention=True, loop_callback=observe)
            entropies += [e for e in attention_measures([{"attention": w} for w in weights])[0] if e is not None]
            predicted = [SYMBOLS[i] for i in out.scores[0].argmax(-1).tolist()]
            expected = execute(dict(pairs), start, args.loops)
            wrong = next((i + 1 for i, (p, e) in enumerate(zip(predicted, expected)) if p != e), None)
            for c in checks:
                right[c] += wrong is None or wrong > c
            _, period = cycle_entry(dict(pairs), start)
            h = torch.stack(states)
            probe_runs.append(ProbeRun(table, h[:args.probe_loops], [start] + expected[:args.probe_loops]))
            again = next((t for t in range(1, len(expected)) if expected[t] == expected[0]), None)
            if wrong is None and again is not None:  # loop 1's state against the next visit to its letter
                first_offsets.append(float((h[0] - h[again]).norm() / h[again].norm()))
            gaps = (h[period:] - h[:-period]).norm(dim=-1) / h[:-period].norm(dim=-1)   # [loops - p]
            for after in drift:  # on the table's own cycle only: a run gone wrong walks another one
                if wrong is None and gaps.numel() > after:
                    drift[after] = max(drift[after], float(gaps[after:].max()))
        cells = [f"{right[c] / args.tables:.3f}" for c in checks] + [f"{drift[32]:.2e}", f"{drift[100]:.2e}"]
        print(f"| {bundle.checkpoint_id} | " + " | ".join(cells) + f" |  ({time.time() - began:.0f} s)")
        probe = decodability(probe_runs)
        reads = [" / ".join("–" if a is None else f"{a:.3f}" for a in row["accuracy"][:3])
                 for row in probe["rows"]] if probe else ["–"] * 3
        inside.append([bundle.checkpoint_id, f"{statistics.median(entropies):.1e}", f"{max(entropies):.2f}",
                       f"{min(first_offsets, default=0):.3f}–{max(first_offsets, default=0):.3f} "
                       f"({len(first_offsets)} runs)", *reads])
    print("\n| model | attention entropy, median (nats) | largest | loop 1's state from the next visit to its "
          "letter | probe reads x_t, held out (loops 1–8 / 9–32 / 33–64) | x_t−1 | x_t−2 |")
    print("|---" * 7 + "|")
    for row in inside:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
