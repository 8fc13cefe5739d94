"""Reading features while decoding: a reply's decode rate with its model's sparse dictionary read at every token
(webapp/chat/decode/readings.py, from the stream the step computes anyway) against the same reply without it.

    .venv/bin/python -m bench.decode.features                                  # 254M, a 16,384-feature dictionary
    .venv/bin/python -m bench.decode.features --bundled --no-doc                # the bundled model and dictionary

Both as the core runs them: a reply alone (generate(), odds kept, as every chat reply keeps them) and a batch of
rows stepped together (generate.decode_step). Plain and read runs are interleaved, medians of the reps. The
random model's dictionary is a random TopK one of the given width and k after its middle block (its weights do
not change the cost); --bundled reads models/chat with the dictionaries beside it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bench import common

BUNDLED = Path(__file__).resolve().parents[2] / "models/chat/model.safetensors"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="gpt2-254m")
    p.add_argument("--bundled", action="store_true", help="the bundled chat model and its dictionaries")
    p.add_argument("--width", type=int, default=16384)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompt", type=int, default=200, help="prompt tokens of each reply")
    p.add_argument("--tokens", type=int, default=48, help="tokens decoded per rep")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def random_dictionary(model, width: int, k: int):
    from webapp.chat.features.dictionaries import LoadedDictionary
    from webapp.chat.features.sae import Dictionary, DictionaryConfig
    layer = model.config.n_layer // 2
    torch.manual_seed(0)
    sae = Dictionary(DictionaryConfig(model.config.n_embd, width, "topk", k, layer)).eval()
    return {"random": LoadedDictionary("random", Path("random"), sae, [], [], None, "random")}


def alone_rate(loaded, ids: list[int], tokens: int) -> float:
    from webapp.chat.decode.generate import generate
    last = None
    for piece in generate(loaded, ids, max_new_tokens=tokens, top_k=50, seed=0, odds=True, features=True):
        last = piece
    assert last is not None and last.stats is not None and last.stats.decode_tokens_per_s is not None
    return last.stats.decode_tokens_per_s


def batch_rate(loaded, ids: list[int], rows: int, tokens: int) -> float:
    """Tokens a second over all rows, rows decoded together after each one's prefill, until they end."""
    from webapp.chat.decode.generate import Sequence, decode_step
    from webapp.chat.decode.types import SamplingParams
    seqs = [Sequence(loaded, ids[r:], SamplingParams(tokens + 1, 1.0, 50, r), odds=True, features=True)
            for r in range(rows)]
    for seq in seqs:
        while seq.prefilling:
            seq.prefill_chunk()
        seq.drain()
    started = time.perf_counter()
    for _ in range(tokens):
        decode_step(loaded.model, seqs)
    for seq in seqs:
        seq.close()  # reads what is still waiting
    return rows * tokens / (time.perf_counter() - started)


def main(argv=None):
    args = parse_args(argv)
    load_before = common.load_average()
    torch.set_grad_enabled(False)
    if args.bundled:
        from webapp.chat.features.dictionaries import load_dictionaries
        from webapp.chat.model.loading import load_chat_model
        loaded = load_chat_model(str(BUNDLED))
        dictionaries = load_dictionaries("", str(BUNDLED), loaded.model, loaded.tokenizer)  # as boot loads them
        name = "the bundled model"
        assert dictionaries, "the bundled model loaded no dictionary"
        described = ", ".join(f"{d.name} ({d.sae.config.d_sae} features, {d.sae.config.architecture}, "
                              f"after block {d.layer})" for d in dictionaries.values())
        ids = [t % 256 for t in common.prompt_ids(args.prompt)]
    else:
        model = common.random_gpt(args.size)
        loaded = common.loaded(model)
        dictionaries, name = random_dictionary(model, args.width, args.k), f"random {args.size}"
        described = f"a random TopK dictionary, {args.width} features, k = {args.k}, after block " \
                    f"{model.config.n_layer // 2}"
        ids = common.prompt_ids(args.prompt)
    cases = {"alone": lambda: alone_rate(loaded, ids, args.tokens),
             f"batch of {args.batch}": lambda: batch_rate(loaded, ids, args.batch, args.tokens)}
    rates: dict[tuple[str, bool], list[float]] = {(c, read): [] for c in cases for read in (False, True)}
    loaded.dictionaries = {}
    cases["alone"]()  # warm-up
    for _ in range(args.reps):
        for case, run in cases.items():
            for read in (False, True):
                loaded.dictionaries = dictionaries if read else {}
                rates[(case, read)].append(run())
    rows = []
    for case in cases:
        plain, read = common.median(rates[(case, False)]), common.median(rates[(case, True)])
        rows.append([case, f"{plain:.1f}", f"{read:.1f}", f"{read / plain:.3f}"])
    body = (common.table(["decode", "tokens/s, no dictionary", "tokens/s, features read", "× without"], rows)
            + f"\n\n- model: {name}, float32; {described}; {args.prompt}-token prompts, {args.tokens} tokens a rep, "
              f"{args.reps} interleaved reps, medians; odds kept in both (as every chat reply keeps them)")
    common.report(f"Reading features while decoding, {name}", body, load_before=load_before,
                  write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
