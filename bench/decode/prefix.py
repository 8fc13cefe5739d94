"""Prefix reuse: time to first token of a follow-up turn with the previous turn's KV cache vs a cold
prefill of the same prompt, and a check that both sample the same tokens with the same seed.

    .venv/bin/python -m bench.decode.prefix                  # 254M config, ~800-token follow-up prompt
    .venv/bin/python -m bench.decode.prefix --size gpt2 --reps 1 --no-doc

Per round: turn 1 (a long user message) is generated through the prefix cache, as the chat service does;
then turn 2 = few-shot + turn 1 + its reply (as text, re-tokenized like the app does) + a short new
message is timed warm (through the cache) and cold (no cache), alternately first.
"""

from __future__ import annotations

import argparse

from bench import common

WORDS = ("the model reads every token of the conversation again unless its keys and values were kept "
         "from the previous turn so a long history costs a long prefill each time").split()


def long_message(tokens: int, tok) -> str:
    words, text = [], ""
    i = 0
    while len(tok.encode_ordinary(text)) < tokens:
        words.append(WORDS[(i * 7) % len(WORDS)] + (str(i) if i % 11 == 0 else ""))
        text = " ".join(words)
        i += 1
    return text


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="gpt2-254m")
    p.add_argument("--first", type=int, default=600, help="tokens of turn 1's user message")
    p.add_argument("--reply", type=int, default=100, help="tokens of turn 1's reply")
    p.add_argument("--new", type=int, default=16, help="tokens sampled in the timed turn 2")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from webapp.chat.decode.generate import generate
    from webapp.chat.decode.prefix_cache import PrefixCache
    load_before = common.load_average()
    loaded = common.loaded(common.random_gpt(args.size))
    tok = loaded.tokenizer
    first = [{"role": "user", "content": long_message(args.first, tok)}]
    warm, cold, reused, same, lengths = [], [], [], [], []
    common.glassbox(loaded, common.prompt_ids(40), 4)  # warm-up
    for r in range(args.reps):
        cache = PrefixCache()
        ids1 = loaded.prompt.build(first, args.reply)
        text = "".join(p.text for p in generate(loaded, ids1, max_new_tokens=args.reply, seed=100 + r,
                                                prefix_cache=cache))
        turns = first + [{"role": "assistant", "content": text}, {"role": "user", "content": f"And then {r}?"}]
        ids2 = loaded.prompt.build(turns, args.new)
        lengths.append(len(ids2))
        order = ("warm", "cold") if r % 2 == 0 else ("cold", "warm")
        runs = {}
        for which in order:  # a cold run (no cache) leaves turn 1's cache where it is
            runs[which] = common.glassbox(loaded, ids2, args.new, seed=r,
                                          prefix_cache=cache if which == "warm" else None)
        warm.append(runs["warm"].ttft_s)
        cold.append(runs["cold"].ttft_s)
        reused.append(runs["warm"].extra["reused"])
        same.append(runs["warm"].extra["tokens"] == runs["cold"].extra["tokens"])
        print(f"  round {r}: prompt {len(ids2)} tokens, reused {reused[-1]}, TTFT warm {warm[-1]:.3f}s, "
              f"cold {cold[-1]:.3f}s", flush=True)
    w, c = common.median(warm), common.median(cold)
    rows = [[args.size, common.median(lengths), common.median(reused), w, c, w / c, all(same)]]
    body = (common.table(["model", "turn-2 prompt tokens", "reused from cache", "TTFT warm s", "TTFT cold s",
                          "warm ÷ cold", "same tokens warm and cold"], rows)
            + f"\n\n- random weights (seed 0), fp32; turn 1: a {args.first}-token message and a {args.reply}-token "
            + f"reply (re-tokenized from its text, as the app does); turn 2 samples {args.new} tokens; "
            + f"{args.reps} rounds, warm and cold alternately first; medians.\n")
    common.report("Prefix reuse: follow-up time to first token, warm vs cold", body, load_before=load_before,
                  write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
