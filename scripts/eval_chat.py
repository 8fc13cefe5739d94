"""Exact-answer rate of a chat model on the held-out synthetic questions, per category.

    python scripts/eval_chat.py                          # the bundled models/chat/model.safetensors
    python scripts/eval_chat.py --history 2              # each question after two earlier Q/A turns
    python scripts/eval_chat.py --dtype int8             # at another precision (GLASSBOX_DTYPE)

Questions go through the product's own path: load_chat_model -> PromptBuilder -> generate, greedy.
A reply counts only if it equals the expected answer exactly.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from chat_corpus import CATEGORIES, held_out  # noqa: E402

from webapp.chat.decode.generate import generate  # noqa: E402
from webapp.chat.model.loading import load_chat_model  # noqa: E402


def answer(loaded, messages, max_new_tokens=200, stats=None) -> str:
    ids = loaded.prompt.build(messages, max_new_tokens)
    pieces = list(generate(loaded, ids, max_new_tokens=max_new_tokens, temperature=0))
    if stats is not None:
        stats.append(pieces[-1].stats)
    return "".join(p.text for p in pieces)


def evaluate(checkpoint, history: int = 0, n_arithmetic: int = 400, limit: int | None = None,
             show_failures: int = 20, dtype: str = "float32") -> dict:
    loaded = load_chat_model(str(checkpoint), dtype=dtype)
    print(f"model: {loaded.checkpoint_id}: {loaded.description}")
    questions = held_out(n_arithmetic=n_arithmetic)
    rng = random.Random(0)
    if limit:
        questions = rng.sample(questions, min(limit, len(questions)))  # a quick look, not the figure
    right, total, failures, stats = defaultdict(int), defaultdict(int), [], []
    one_digit = [0, 0]  # right, total: sums whose operands are both one digit (2 + 3, 7 - 4)
    t0 = time.time()
    for qa in questions:
        messages = []
        for prior in rng.sample(questions, history):  # earlier turns, answered correctly
            messages += [{"role": "user", "content": prior.question}, {"role": "assistant", "content": prior.answer}]
        messages.append({"role": "user", "content": qa.question})
        reply = answer(loaded, messages, stats=stats)
        total[qa.category] += 1
        small = qa.category == "arithmetic" and all(len(n) == 1 for n in qa.answer.split(" = ")[0].split()[::2])
        one_digit[1] += small
        if reply == qa.answer:
            right[qa.category] += 1
            one_digit[0] += small
        else:
            failures.append((qa, reply))
    seconds = time.time() - t0

    print(f"\nheld-out exact answers ({history} prior turns, greedy, {seconds:.0f} s):\n")
    print("| category | questions | exact | rate |\n|---|---:|---:|---:|")
    for cat in CATEGORIES:
        if total[cat]:
            print(f"| {cat} | {total[cat]} | {right[cat]} | {right[cat] / total[cat]:.1%} |")
        if cat == "arithmetic" and one_digit[1]:
            share = one_digit[0] / one_digit[1]
            print(f"| … of which one-digit operands | {one_digit[1]} | {one_digit[0]} | {share:.1%} |")
    n, r = sum(total.values()), sum(right.values())
    print(f"| **all** | {n} | {r} | {r / n:.1%} |")
    ttft = statistics.median(s.time_to_first_token_s for s in stats)
    rates = [s.decode_tokens_per_s for s in stats if s.decode_tokens_per_s]
    print(f"\nmedian time to first token {ttft * 1000:.0f} ms (prompt ~{stats[0].prompt_tokens} tokens), "
          f"median decode {statistics.median(rates):.0f} tokens/s")
    for qa, reply in failures[:show_failures]:
        print(f"  miss [{qa.category}] {qa.question!r}: got {reply!r}, expected {qa.answer!r}")
    return {"rate": r / n, "per_category": {c: right[c] / total[c] for c in total if total[c]}, "seconds": seconds,
            "one_digit": one_digit[0] / max(one_digit[1], 1)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", nargs="?", default=str(ROOT / "models/chat/model.safetensors"))
    p.add_argument("--history", type=int, default=0, help="earlier Q/A turns before each question")
    p.add_argument("--arithmetic", type=int, default=400,
                   help="held-out arithmetic pairs drawn at random (every held-out one-digit pair is added)")
    p.add_argument("--limit", type=int, default=None, help="a random subset of this many questions")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--show-failures", type=int, default=20, help="print this many of the misses")
    p.add_argument("--dtype", default="float32", help="a precision, as GLASSBOX_DTYPE: float32, bfloat16, int8")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    evaluate(args.checkpoint, history=args.history, n_arithmetic=args.arithmetic, limit=args.limit,
             show_failures=args.show_failures, dtype=args.dtype)


if __name__ == "__main__":
    main()
