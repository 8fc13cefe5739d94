"""Inside this token: the first render of the Inside page for the last token of a 1,000-token context
(prompt + reply so far) on the 254M model, through the real app (job on the core, page rendered).

    .venv/bin/python -m bench.serving.inside                  # 254M, float32, 1,000-token context
    .venv/bin/python -m bench.serving.inside --size gpt2 --context 300 --reps 1 --no-doc
    .venv/bin/python -m bench.serving.inside --flood 12 --baseline main   # a cached Inside JSON flood (inside_flood.py)

Three cases, each a GET of the page (shared link, so no cookie is needed):
- cold: no KV cache kept for the conversation: the whole context runs through the model, block by block;
- kept cache: as right after the reply finished (its KV cache kept for the next turn): the first 999
  positions' keys and values are copied from it and only the last position runs;
- report kept: the same page again (the report is kept in memory): rendering alone.
The reply is saved straight into the store (random GPT-2 ids as its tokens), not generated: a 254M reply
of 200 tokens would take minutes here and changes nothing of what is timed.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from bench import common
from bench.decode.prefix import long_message


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="gpt2-254m")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "int8"])
    p.add_argument("--context", type=int, default=1000, help="positions 0..p of the token looked into")
    p.add_argument("--reps", type=int, default=3, help="reps of the kept-cache and kept-report cases")
    p.add_argument("--no-doc", action="store_true")
    p.add_argument("--flood", type=int, default=0, help="N threads flooding a cached Inside JSON (inside_flood.py)")
    p.add_argument("--baseline", default="", help="with --flood: a git revision measured too, before")
    p.add_argument("--replies", type=int, default=4, help="with --flood: the good user's replies per phase")
    p.add_argument("--rounds", type=int, default=3, help="with --flood: alone then flooded, this many times")
    p.add_argument("--tokens", type=int, default=150, help="with --flood: the good user's reply length")
    p.add_argument("--gzip", action="store_true", help="with --flood: the flood takes gzip")
    p.add_argument("--addresses", type=int, default=1, help="with --flood: the flood's threads spread over these")
    p.add_argument("--pace", type=float, default=0.0, help="with --flood: requests a second per thread (0: flat out)")
    p.add_argument("--nginx", action="store_true", help="with --flood: the flood through nginx (deploy/nginx.conf)")
    return p.parse_args(argv)


def saved_reply(app, loaded, context: int):
    """A finished reply whose last token's context is `context` ids -> (share token, message id, index, ids)."""
    from webapp.chat.decode.types import ReplyStats
    from webapp.chat.web.blueprint import service
    turns = [{"role": "user", "content": long_message(context - 260, loaded.tokenizer)}]
    prompt = loaded.prompt.explain(turns, 200)
    index = context - len(prompt.ids)  # token `index` is produced at position context - 1
    reply = common.prompt_ids(index + 1, seed=7)
    odds = [[t, 0.5, 0.5, 1, 1.0, []] for t in reply]
    with app.app_context():
        store = service().store
        ids = store.begin_turn("bench", None, user_text=turns[0]["content"], branch_from=None,
                               settings={"temperature": 1.0, "top_k": 50, "max_new_tokens": 200, "seed": None},
                               prompt=prompt.as_dict())
        store.finish_reply(ids.reply_id, "reply", "complete", None, ReplyStats(tokens=len(reply)), odds)
        token = store.share_conversation("bench", ids.conversation_id)
    return token, ids.reply_id, index, list(prompt.ids) + reply[:index]


def timed_get(client, url: str) -> float:
    started = time.perf_counter()
    answer = client.get(url)
    seconds = time.perf_counter() - started
    assert answer.status_code == 200, answer.get_data(as_text=True)[:500]
    return seconds


def main(argv=None):
    args = parse_args(argv)
    if args.flood:
        from bench.serving import inside_flood
        return inside_flood.main(args)
    from webapp import create_app
    from webapp.chat.inside.service import InsideService
    from webapp.chat.model.gpt import Chunk
    from webapp.chat.model.precision import apply_precision
    from webapp.config import Settings
    from webapp.web.state import glassbox
    load_before = common.load_average()
    model = apply_precision(common.random_gpt(args.size), args.dtype)
    loaded = common.loaded(model)
    with tempfile.TemporaryDirectory() as folder:
        app = create_app(Settings(instance_path=folder, secret_key="bench-secret-key-0123"), models={"chat": loaded})
        core = glassbox(app).core
        core.ready.wait(600)
        try:
            token, mid, index, context = saved_reply(app, loaded, args.context)
            url = f"/chat/shared/{token}/m/{mid}/inside/{index}"
            client = app.test_client()
            inside = glassbox(app).service(InsideService)
            cold = timed_get(client, url)
            kept, again = [], []
            for _ in range(args.reps):
                inside.kept.clear()  # the report is worked out again, from the kept cache
                cache = model.new_cache()
                with torch.inference_mode():  # what the finished reply leaves behind
                    model.prefill([Chunk(context[:-1], cache, 0, logits=False)])
                loaded.prefix_cache.put(cache, context[:-1], model)
                kept.append(timed_get(client, url))
                again.append(timed_get(client, url))
            page = client.get(url).get_data(as_text=True)
            reused = "reusing the keys and values of the first" in page
        finally:
            core.shutdown()
    rows = [["cold (no KV cache kept)", len(context), cold, "1 run"],
            ["kept KV cache (the reply just finished)", len(context), common.median(kept),
             f"{args.reps} reps, range {min(kept):.3g}–{max(kept):.3g}"],
            ["report kept (the page again)", len(context), common.median(again),
             f"{args.reps} reps, range {min(again):.3g}–{max(again):.3g}"]]
    body = (common.table(["case", "context tokens", "first render s", "reps"], rows)
            + f"\n\n- model: random {args.size}, {args.dtype}; the page's GET through the app's test client "
              f"(job queued on the core, run, page rendered); kept-cache page says it reused the cache: {reused}")
    common.report(f"Inside this token, {args.size} {args.dtype}", body, load_before=load_before,
                  write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
