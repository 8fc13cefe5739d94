"""Who pushed this token: one direct logit attribution (the JSON of the last token of a long context) on the
bundled chat model and on a random 254M model, through the real app (job on the core, JSON answered).

    .venv/bin/python -m bench.serving.attribution                       # bundled + gpt2-254m, float32, 1,000 tokens
    .venv/bin/python -m bench.serving.attribution --models bundled --context 300 --reps 1 --no-doc

Per model, each a GET of `attribution/<i>.json?against=<id>` through a share link (no cookie needed):
- cold: no KV cache kept for the conversation: the whole context runs through the model, block by block;
- kept KV cache: as right after the reply finished (its KV cache kept for the next turn): the first
  positions' keys and values are read from it and only the last position runs;
- report kept: the same request again (the report is kept in memory).
and, beside them, the job's own work with the kept cache (webapp/chat/attribution/jobs.attribution_report
on the calling thread), so what the app adds shows, and one decode step of one reply with the same cache
for scale (a busy machine slows both). The reply is saved straight into the store (random
ordinary ids as its tokens), not generated.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from bench import common
from bench.decode.prefix import long_message
from bench.serving.inside import timed_get
from webapp.chat.model.gpt import Chunk

BUNDLED = common.ROOT / "models" / "chat" / "model.safetensors"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["bundled", "gpt2-254m"], help="'bundled' or a preset")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "int8"])
    p.add_argument("--context", type=int, default=1000, help="positions 0..p of the token split")
    p.add_argument("--reps", type=int, default=5, help="reps of the kept-cache and kept-report cases")
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def load(name: str, dtype: str):
    from webapp.chat.model.loading import load_chat_model
    from webapp.chat.model.precision import apply_precision
    if name == "bundled":
        return load_chat_model(str(BUNDLED), dtype=dtype)
    return common.loaded(apply_precision(common.random_gpt(name), dtype))


def saved_reply(app, loaded, context: int):
    """A finished reply whose last token's context is `context` ids -> (share token, message id, index, ids)."""
    from webapp.chat.decode.types import ReplyStats
    from webapp.chat.web.blueprint import service
    framing = len(loaded.prompt.explain([{"role": "user", "content": "x"}], 200).ids)  # start, few-shot, markers
    # half of what is left is the question, the reply the rest
    turns = [{"role": "user", "content": long_message(max(1, (context - framing) // 2), loaded.tokenizer)}]
    prompt = loaded.prompt.explain(turns, 200)
    index = context - len(prompt.ids)  # token `index` is produced at position context - 1
    generator = torch.Generator().manual_seed(7)
    ordinary = min(loaded.tokenizer.special_ids.values())  # ids below the first special are text
    reply = torch.randint(0, ordinary, (index + 1,), generator=generator).tolist()
    odds = [[t, 0.5, 0.5, 1, 1.0, []] for t in reply]
    with app.app_context():
        store = service().store
        ids = store.begin_turn("bench", None, user_text=turns[0]["content"], branch_from=None,
                               settings={"temperature": 1.0, "top_k": 50, "max_new_tokens": 200, "seed": None},
                               prompt=prompt.as_dict())
        store.finish_reply(ids.reply_id, "reply", "complete", None, ReplyStats(tokens=len(reply)), odds)
        token = store.share_conversation("bench", ids.conversation_id)
    return token, ids.reply_id, index, list(prompt.ids) + reply[:index]


def keep_cache(loaded, context: list[int]) -> None:
    """What the finished reply leaves behind: its KV cache, kept for the conversation's next turn."""
    model = loaded.model
    cache = model.new_cache()
    with torch.inference_mode():
        model.prefill([Chunk(context[:-1], cache, 0, logits=False)])
    loaded.prefix_cache.put(cache, context[:-1], model)


def decode_step_seconds(loaded, context: list[int]) -> float:
    """One batched decode step of one reply at the context's last position (its cache holding the rest), on
    the calling thread as the job alone is timed."""
    model = loaded.model
    cache = model.new_cache()
    with torch.inference_mode():
        model.prefill([Chunk(context[:-1], cache, 0, logits=False)])
        started = time.perf_counter()
        model.decode_step(torch.tensor([[context[-1]]]), [cache], [len(context) - 1], [None])
        return time.perf_counter() - started


def measure(name: str, args) -> list:
    from webapp import create_app
    from webapp.chat.attribution.jobs import AttributionRequest, attribution_report
    from webapp.chat.attribution.service import AttributionService
    from webapp.config import Settings
    from webapp.web.state import glassbox
    loaded = load(name, args.dtype)
    with tempfile.TemporaryDirectory() as folder:
        app = create_app(Settings(instance_path=folder, secret_key="bench-secret-key-0123"), models={"chat": loaded})
        core = glassbox(app).core
        core.ready.wait(600)
        try:
            token, mid, index, context = saved_reply(app, loaded, args.context)
            against = context[-1]
            url = f"/chat/shared/{token}/m/{mid}/attribution/{index}.json?against={against}"
            client = app.test_client()
            service = glassbox(app).service(AttributionService)
            loaded.prefix_cache.clear()  # nothing kept from the warm-up's pinned head either
            cold = timed_get(client, url)
            kept, again, bare, step = [], [], [], []
            for _ in range(args.reps):
                service.kept.clear()  # the report is worked out again, from the kept cache
                keep_cache(loaded, context)
                kept.append(timed_get(client, url))
                again.append(timed_get(client, url))
                request = AttributionRequest(tuple(context), int(client.get(url).get_json()["token"]["id"]),
                                             index, against)
                started = time.perf_counter()
                report = attribution_report(loaded, request, prefix=loaded.prefix_cache)
                bare.append(time.perf_counter() - started)
                step.append(decode_step_seconds(loaded, context))
            reused = report.reused_positions
        finally:
            core.shutdown()
    a = report.attribution
    c = loaded.model.config
    label = f"{'the bundled' if name == 'bundled' else 'random'} {c.n_layer}L/{c.n_head}H/{c.n_embd}d"
    return [[label, "cold (no KV cache kept)", len(context), cold, "1 run"],
            [label, f"kept KV cache ({reused} positions reused)", len(context), common.median(kept),
             f"{args.reps} reps, range {min(kept):.3g}–{max(kept):.3g}"],
            [label, "the job alone, kept KV cache", len(context), common.median(bare),
             f"{args.reps} reps; parts − logit {a.total() - a.logit:.2g}"],
            [label, "report kept (asked again)", len(context), common.median(again), f"{args.reps} reps"],
            [label, "for scale: one decode step of one reply", len(context), common.median(step),
             f"{args.reps} reps, the job alone ÷ step {common.median(bare) / common.median(step):.2f}"]]


def main(argv=None):
    args = parse_args(argv)
    load_before = common.load_average()
    rows = [row for name in args.models for row in measure(name, args)]
    body = (common.table(["model", "case", "context tokens", "seconds", "reps"], rows)
            + f"\n\n- {args.dtype}; the JSON's GET through the app's test client (job queued on the core, run, "
              "answered); `against` the context's last token, so the logit difference is split")
    common.report(f"Who pushed this token, {args.dtype}", body, load_before=load_before, write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
