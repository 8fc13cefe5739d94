"""Evaluate a Loop-lab model bundle on held-out random tables, per bucket of k.

    .venv/bin/python scripts/eval_loops.py [--model models/loops] [--per-bucket 500]

For each bucket (1–8, 9–32, 33–64, 65–128, 129–256) draws random function tables
(the "function" preset; --shuffled also shuffles rule order), start and k
uniform in the bucket, from a seed distinct from training's, and runs the public
`model(...)` contract with num_loops=272, threshold 0.5. Metrics, as the web
page scores one trace:
  answer_correct      last prediction == x_k
  complete_trajectory at least k loops ran and the first k predictions == x1..xk
  exact_stop          halted by the head (final stop prob >= 0.5) and loops == k
  joint_success       answer_correct and exact_stop
Then how the runs failed (webapp/loops/verdict.py; a run can fail both ways):
  wrong_hop           some loop <= k breaks the table (its first wrong letter)
  stopped_early / stopped_late   the head stopped it before / after loop k
  never_stopped       it ran to the 272-loop cap
Examples run batched; the batch is checked against batch-1 calls on a sample.

--reads (models that hand over their loop attention, webapp/loops/reading.py): per bucket, over the
first k loops of each case (fewer if it stopped early), how often the rule read (most attention
mass, heads combined) is the rule of the letter the loop was on (the model's own previous
prediction; the start letter as read for loop 1), and the mean mass on the rule read.
"""

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from webapp.loops.model.checkpoint import load_bundle  # noqa: E402
from webapp.loops.reading import rule_matrix, supports_attention  # noqa: E402
from webapp.loops.task import SYMBOLS, execute, preset, shuffle_rules  # noqa: E402
from webapp.loops.verdict import verdict  # noqa: E402

BUCKETS = ((1, 8), (9, 32), (33, 64), (65, 128), (129, 256))
CAP, THRESHOLD = 272, 0.5
METRICS = ("answer_correct", "complete_trajectory", "exact_stop", "joint_success")
FAILURES = ("wrong_hop", "stopped_early", "stopped_late", "never_stopped")
FAILURE_OF_STOP = {"early": "stopped_early", "late": "stopped_late", "never": "never_stopped"}


def failures_of(pairs, start, k, predictions, halted_by_head) -> set[str]:
    """Which of FAILURES one run shows (none: solved, or right by luck only in answer_correct)."""
    found = verdict(start, dict(pairs), k, predictions, halted_by_head)
    kinds = {FAILURE_OF_STOP[found.stop]} if found.stop in FAILURE_OF_STOP else set()
    return kinds | ({"wrong_hop"} if found.wrong_hop else set())


def score(predictions: list[str], halted_by_head: bool, expected: list[str]) -> dict:
    k = len(expected)
    answer = bool(predictions) and predictions[-1] == expected[-1]
    exact = halted_by_head and len(predictions) == k
    return {"answer_correct": answer,
            "complete_trajectory": len(predictions) >= k and predictions[:k] == expected,
            "exact_stop": exact, "joint_success": answer and exact}


def run_one(bundle, pairs, start, k) -> tuple[list[str], bool]:
    """Batch-1 call exactly as the web page makes it."""
    rows = []
    enc = bundle.tokenizer(bundle.render_prompt(pairs, start, k), add_special_tokens=False,
                           return_tensors="pt")
    out = bundle.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                       num_loops=CAP, completion_threshold=THRESHOLD,
                       readout_token_ids=bundle.readout_token_ids,
                       loop_callback=lambda loop, s, stop, state: rows.append(SYMBOLS[int(s[0].argmax())]))
    return rows, out.stop_logits[0, -1].sigmoid().item() >= THRESHOLD


def run_batch(bundle, cases) -> list[tuple[list[str], bool]]:
    """Many cases in one call; each case's trace is cut at its own first stop."""
    prompts = [bundle.render_prompt(p, s, k) for p, s, k in cases]
    encs = [bundle.tokenizer(t, add_special_tokens=False, return_tensors="pt") for t in prompts]
    ids = torch.cat([e["input_ids"] for e in encs])
    mask = torch.cat([e["attention_mask"] for e in encs])
    out = bundle.model(input_ids=ids, attention_mask=mask, num_loops=CAP,
                       completion_threshold=THRESHOLD, readout_token_ids=bundle.readout_token_ids)
    stop_prob = out.stop_logits.sigmoid()                       # [B, L]
    preds = out.scores.argmax(-1)                               # [B, L]
    results = []
    for b in range(len(cases)):
        fired = (stop_prob[b] >= THRESHOLD).nonzero()
        loops = int(fired[0]) + 1 if len(fired) else CAP
        results.append(([SYMBOLS[i] for i in preds[b, :loops].tolist()], bool(len(fired))))
    return results


def read_stats(bundle, cases) -> tuple[int, int, float, int, int]:
    """-> (loops whose rule read is the current letter's, loops counted, summed mass on the rule read,
    wrong hops (prediction != the table's destination of the letter it was on), those that read right)."""
    prompts = [bundle.render_prompt(p, s, k) for p, s, k in cases]
    ids = torch.cat([bundle.tokenizer(t, add_special_tokens=False, return_tensors="pt")["input_ids"]
                     for t in prompts])
    rules = torch.stack([rule_matrix(p).float() for p, _, _ in cases])          # [B, T, 26]
    reads, masses = [], []

    def observe(loop, scores, stop, state, attention):
        mass = torch.bmm(attention.float().mean(1, keepdim=True), rules)[:, 0]   # [B, 26]
        best, index = mass.max(-1)
        reads.append(index)
        masses.append(best)

    out = bundle.model(input_ids=ids, num_loops=CAP, completion_threshold=THRESHOLD,
                       readout_token_ids=bundle.readout_token_ids, loop_callback=observe,
                       loop_attention=True)
    on = torch.cat([out.start_scores.argmax(-1, keepdim=True), out.scores.argmax(-1)], 1)  # [B, L + 1]
    stop_prob = out.stop_logits.sigmoid()
    hits = counted = wrong = wrong_read_right = 0
    mass_sum = 0.0
    for b, (pairs, _, k) in enumerate(cases):
        fired = (stop_prob[b] >= THRESHOLD).nonzero()
        loops = min(int(fired[0]) + 1 if len(fired) else CAP, k)
        table = dict(pairs)
        for t in range(loops):
            letter = SYMBOLS[int(on[b, t])]
            right = pairs[int(reads[t][b])][0] == letter
            hits += right
            mass_sum += float(masses[t][b])
            if SYMBOLS[int(on[b, t + 1])] != table[letter]:
                wrong, wrong_read_right = wrong + 1, wrong_read_right + right
        counted += loops
    return hits, counted, mass_sum, wrong, wrong_read_right


def make_cases(low, high, n, rng, shuffled, kind="function"):
    cases = []
    for _ in range(n):
        pairs = preset(kind, rng)
        if shuffled:
            pairs = shuffle_rules(pairs, rng)
        cases.append((pairs, rng.choice(SYMBOLS), rng.randint(low, high)))
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/loops", help="bundle directory or module:function")
    parser.add_argument("--per-bucket", type=int, default=500)
    parser.add_argument("--seed", type=int, default=20_260_000, help="held-out seed (training uses small seeds)")
    parser.add_argument("--shuffled", action="store_true", help="shuffle rule order too")
    parser.add_argument("--preset", default="function", help="table kind (a task.preset name)")
    parser.add_argument("--stop-sweep", type=int, default=0, metavar="N",
                        help="also run every k in 1..256 on N tables each and list k whose stop failed")
    parser.add_argument("--check-batch", type=int, default=40, help="cases per bucket re-run at batch 1")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reads", action="store_true",
                        help="also measure which rule each loop read (its attention), per bucket")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bundle = load_bundle(args.model)
    rng = random.Random(args.seed)
    print(f"model {bundle.checkpoint_id}; {args.per_bucket} {args.preset} tables per bucket, "
          f"rule order {'shuffled' if args.shuffled else 'A..Z'}, seed {args.seed}")
    print("| k | " + " | ".join(METRICS) + " |")
    print("|---" * (len(METRICS) + 1) + "|")
    began, mismatches, checked, single_loops, single_seconds = time.time(), 0, 0, 0, 0.0
    failures, failure_rows, read_lines = [], [], []
    if args.reads and not supports_attention(bundle.model):
        sys.exit("--reads: attention is not available for this model")
    with torch.inference_mode():
        for low, high in BUCKETS:
            cases = make_cases(low, high, args.per_bucket, rng, args.shuffled, args.preset)
            results = run_batch(bundle, cases)
            for case, result in list(zip(cases, results))[: args.check_batch]:
                checked, tick = checked + 1, time.perf_counter()
                single = run_one(bundle, *case)
                single_seconds += time.perf_counter() - tick
                single_loops += len(single[0])
                mismatches += single != result
            totals = dict.fromkeys(METRICS + FAILURES + ("both",), 0)
            for (pairs, start, k), (preds, head) in zip(cases, results):
                row = score(preds, head, execute(dict(pairs), start, k))
                for key in METRICS:
                    totals[key] += row[key]
                kinds = failures_of(pairs, start, k, preds, head)
                for key in kinds:
                    totals[key] += 1
                totals["both"] += "wrong_hop" in kinds and len(kinds) > 1
                if not row["joint_success"] and len(failures) < 10:
                    failures.append(f"k={k} start={start} loops={len(preds)} head={head} "
                                    f"answer={row['answer_correct']}")
            print(f"| {low}–{high} | " + " | ".join(f"{totals[m] / len(cases):.3f}" for m in METRICS) + " |")
            failure_rows.append(f"| {low}–{high} | {totals['joint_success'] / len(cases):.3f} | "
                                + " | ".join(f"{totals[m] / len(cases):.3f}" for m in FAILURES + ("both",)) + " |")
            if args.reads:
                hits, counted, mass, wrong, wrong_right = read_stats(bundle, cases)
                read_lines.append(f"| {low}–{high} | {hits / counted:.3f} | {mass / counted:.3f} | {counted} "
                                  f"| {wrong} | {wrong_right} |")
        print("\nHow runs failed (fractions of all runs; wrong_hop and a stop failure can both happen: 'both')")
        print("| k | joint_success | " + " | ".join(FAILURES) + " | both |")
        print("|---" * (len(FAILURES) + 3) + "|")
        print("\n".join(failure_rows))
        if args.stop_sweep:
            sweep = [case for k in range(1, 257)
                     for case in make_cases(k, k, args.stop_sweep, rng, args.shuffled, args.preset)]
            bad = sorted({case[2] for case, (preds, head) in zip(sweep, run_batch(bundle, sweep))
                          if not (head and len(preds) == case[2])})
            print(f"stop sweep, k = 1..256 x {args.stop_sweep} tables: exact_stop failed at k = {bad or 'none'}")
    if read_lines:
        print("\n| k | rule read = current letter's | mean mass on the rule read | loops "
              "| wrong hops | of those, rule read right |")
        print("|---|---|---|---|---|---|")
        print("\n".join(read_lines))
    print(f"batch vs batch-1: {mismatches} mismatches in {checked} re-run cases; batch-1 speed "
          f"{1000 * single_seconds / max(single_loops, 1):.2f} ms per loop (prompt encoding included)")
    print(f"eval took {time.time() - began:.1f}s")
    for line in failures:
        print("failure:", line)
    if mismatches:
        sys.exit("batched evaluation disagreed with batch-1 calls")


if __name__ == "__main__":
    main()
