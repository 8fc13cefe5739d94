"""Intra-op threads for chat decoding, on a quiet machine and with another process holding a core.

    .venv/bin/python -m bench.decode.threads                   # bundled model and the 254M config
    .venv/bin/python -m bench.decode.threads --sizes bundled --reps 2 --no-doc

Per model and per machine state, 1 thread and all threads (torch's default) alternate, A B A B.
"Busy" starts a second process that multiplies matrices on one thread for as long as the state
lasts, the way another job on a shared host would. Run it on an otherwise idle machine: it is the
evidence behind GLASSBOX_CHAT_TORCH_THREADS' default (one thread for a small model).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import subprocess
import sys
import time

import torch

from bench import common

BUSY = ("import torch\ntorch.set_num_threads(1)\na = torch.randn(1024, 1024)\n"
        "while True:\n    a @ a\n")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="bundled,gpt2-254m", help="'bundled' and/or presets")
    p.add_argument("--prompt", type=int, default=300, help="prompt tokens")
    p.add_argument("--new", type=int, default=40, help="new tokens per reply")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


class NeverEnds:
    """A tokenizer that ends no reply: every run decodes exactly --new tokens."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def is_special(self, token):
        return False

    def decode_single_token_bytes(self, token):
        return b"" if self.inner.is_special(token) else self.inner.decode_single_token_bytes(token)


def model_and_prompt(size: str, prompt: int):
    if size == "bundled":
        from webapp.chat.boot import load_model
        from webapp.config import Settings
        loaded = load_model(Settings())
        ids = list(range(97, 123)) * (prompt // 26 + 1)  # letters: any byte string is a prompt
        return dataclasses.replace(loaded, tokenizer=NeverEnds(loaded.tokenizer)), ids[:prompt]
    return common.loaded(common.random_gpt(size)), common.prompt_ids(prompt)


class BusyCore:
    """Another process keeping one core busy while the `with` lasts."""

    def __enter__(self):
        self.process = subprocess.Popen([sys.executable, "-c", BUSY])
        time.sleep(1.0)  # let it start multiplying
        return self

    def __exit__(self, *exc):
        self.process.kill()
        self.process.wait()


def main(argv=None):
    args = parse_args(argv)
    load_before = common.load_average()
    default = torch.get_num_threads()
    rows = []
    for size in args.sizes.split(","):
        loaded, ids = model_and_prompt(size, args.prompt)
        for state in ("quiet", "busy"):
            runs: dict[int, list] = {1: [], default: []}
            with BusyCore() if state == "busy" else contextlib.nullcontext():
                for r in range(args.reps + 1):  # round 0 warms up
                    for threads in runs:
                        torch.set_num_threads(threads)
                        run = common.glassbox(loaded, list(ids), args.new)
                        if r:
                            runs[threads].append(run)
                        print(f"  {size} {state} {threads} thread(s): {run.tokens_per_s:.1f} tok/s", flush=True)
            torch.set_num_threads(default)
            one = common.median([r.tokens_per_s for r in runs[1]])
            for threads, done in runs.items():
                rate = common.median([r.tokens_per_s for r in done])
                rows.append([size, state, threads, common.median([r.ttft_s for r in done]), rate, rate / one])
    body = (common.table(["model", "machine", "threads", "TTFT s", "decode tok/s", "÷ 1 thread"], rows)
            + f"\n\n- {args.prompt}-token prompt, {args.new} new tokens, top-k 50, fp32, {args.reps} rounds "
            + "interleaved after one warm-up; busy = a second process multiplying 1024x1024 matrices on "
            + "one thread.\n")
    common.report("Chat decoding: intra-op threads, quiet and with a busy core", body,
                  load_before=load_before, write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
