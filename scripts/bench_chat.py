"""Decode speed of the chat model path: KV cache against the owner's full-recompute loop.

    python scripts/bench_chat.py --arch gpt2-254m --prompt 800 --threads 2

Random weights (speed does not depend on them), greedy with the specials masked so every run
decodes the same number of tokens, through the real generate(). Prints time to first token and
decode tokens/s for each path and dtype.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from webapp.chat.generate import generate  # noqa: E402
from webapp.chat.loading import LoadedChatModel  # noqa: E402
from webapp.chat.model import GPT, PRESETS  # noqa: E402
from webapp.chat.prompt import PromptBuilder  # noqa: E402
from webapp.chat.tokenizer import ByteTokenizer  # noqa: E402


def run(loaded, prompt, tokens):
    pieces = list(generate(loaded, prompt, max_new_tokens=tokens, temperature=0))
    return pieces[-1].stats


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="gpt2-254m", choices=list(PRESETS))
    p.add_argument("--prompt", type=int, default=800, help="prompt tokens")
    p.add_argument("--tokens", type=int, default=32, help="tokens decoded with the KV cache")
    p.add_argument("--recompute-tokens", type=int, default=3, help="tokens decoded by full recompute")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtypes", default="float32,bfloat16")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(PRESETS[args.arch]).eval()
    tok = ByteTokenizer()  # ids only; the vocab of the preset is larger, which the mask below covers
    model.lm_head.register_forward_hook(lambda m, a, out: out.index_fill_(
        -1, torch.arange(tok.first_special_id, out.size(-1)), float("-inf")))
    prompt = [(17 * i) % 256 for i in range(args.prompt)]
    print(f"{args.arch}: {model.num_params() / 1e6:.0f}M params, prompt {args.prompt} tokens, "
          f"{args.threads} thread(s), torch {torch.__version__}")
    for name in args.dtypes.split(","):
        model.to(getattr(torch, name))
        for kv, tokens in ((True, args.tokens), (False, args.recompute_tokens)):
            loaded = LoadedChatModel(model, tok, model.config.block_size, kv, "bench", "bench",
                                     PromptBuilder(tok, model.config.block_size))
            run(loaded, prompt[:64], 2)  # warm-up
            s = run(loaded, prompt, tokens)
            print(f"  {name:9s} {'KV cache' if kv else 'recompute':9s} time to first token {s.time_to_first_token_s:6.2f} s, "
                  f"decode {s.decode_tokens_per_s:7.2f} tokens/s over {s.new_tokens} tokens")


if __name__ == "__main__":
    main()
