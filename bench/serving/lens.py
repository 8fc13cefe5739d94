"""The logit lens over a whole reply: one grid (the JSON, then the page) on the bundled chat model and on a
random 254M model, through the real app (a job on the core, then the answer), for an 800-token context:
a prompt of about 544 tokens and a reply of 256 (the most the grid shows).

    .venv/bin/python -m bench.serving.lens                        # bundled + gpt2-254m, float32
    .venv/bin/python -m bench.serving.lens --models bundled --reps 1 --no-doc

Per model, through a share link (no cookie needed):
- the JSON, cold: the job runs (one forward over prompt and reply, the output layer in chunks), then JSON;
- the JSON with the reply's KV cache kept (as right after it finished): the prompt's keys and values are
  read from it, only the reply's positions run;
- the JSON again: the report and its bytes kept;
- the page: the report kept, the grid's rows rendered (once per report), then again with them kept;
and the job's own work on the calling thread (webapp/chat/lens/jobs.lens_report), so what the app adds
shows. The reply is saved straight into the store (random ordinary ids as its tokens), not generated.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from bench import common
from bench.decode.prefix import long_message
from bench.serving.attribution import keep_cache, load
from bench.serving.inside import timed_get


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["bundled", "gpt2-254m"], help="'bundled' or a preset")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "int8"])
    p.add_argument("--prompt", type=int, default=544, help="prompt tokens (about)")
    p.add_argument("--reply", type=int, default=256, help="reply tokens")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def saved_reply(app, loaded, prompt_tokens: int, reply_tokens: int):
    """A finished, shared reply -> (share token, message id, prompt ids, reply ids)."""
    from webapp.chat.decode.types import ReplyStats
    from webapp.chat.web.blueprint import service
    framing = len(loaded.prompt.explain([{"role": "user", "content": "x"}], reply_tokens).ids)
    turns = [{"role": "user", "content": long_message(max(1, prompt_tokens - framing), loaded.tokenizer)}]
    prompt = loaded.prompt.explain(turns, reply_tokens)
    ordinary = min(loaded.tokenizer.special_ids.values())  # ids below the first special are text
    reply = torch.randint(0, ordinary, (reply_tokens,), generator=torch.Generator().manual_seed(7)).tolist()
    odds = [[t, 0.5, 0.5, 1, 1.0, []] for t in reply]
    with app.app_context():
        store = service().store
        ids = store.begin_turn("bench", None, user_text=turns[0]["content"], branch_from=None,
                               settings={"temperature": 1.0, "top_k": 50, "max_new_tokens": reply_tokens,
                                         "seed": None}, prompt=prompt.as_dict())
        store.finish_reply(ids.reply_id, "reply", "complete", None, ReplyStats(tokens=len(reply)), odds)
        token = store.share_conversation("bench", ids.conversation_id)
    return token, ids.reply_id, list(prompt.ids), reply


def measure(name: str, args) -> list:
    from webapp import create_app
    from webapp.chat.lens.jobs import LensRequest, lens_report
    from webapp.chat.lens.service import LensService
    from webapp.config import Settings
    from webapp.web.state import glassbox
    loaded = load(name, args.dtype)
    with tempfile.TemporaryDirectory() as folder:
        settings = Settings(instance_path=folder, secret_key="bench-secret-key-0123", inside_wait_seconds=600)
        app = create_app(settings, models={"chat": loaded})
        core = glassbox(app).core
        core.ready.wait(600)
        try:
            token, mid, prompt, reply = saved_reply(app, loaded, args.prompt, args.reply)
            url = f"/chat/shared/{token}/m/{mid}/lens"
            client = app.test_client()
            service = glassbox(app).service(LensService)
            cold, kept, again, page, page_again, bare = [], [], [], [], [], []
            for _ in range(args.reps):
                service.kept.clear()
                loaded.prefix_cache.clear()  # nothing kept from the warm-up's pinned head either
                cold.append(timed_get(client, f"{url}.json"))
                service.kept.clear()  # as right after the reply finished: its KV cache kept
                keep_cache(loaded, prompt + reply)
                kept.append(timed_get(client, f"{url}.json"))
                again.append(timed_get(client, f"{url}.json"))
                page.append(timed_get(client, url))
                page_again.append(timed_get(client, url))
                started = time.perf_counter()
                lens_report(loaded, LensRequest(tuple(prompt), tuple(reply)))
                bare.append(time.perf_counter() - started)
            json_bytes = len(client.get(f"{url}.json").get_data())
            page_bytes = len(client.get(url).get_data())
        finally:
            core.shutdown()
    c = loaded.model.config
    label = f"{'the bundled' if name == 'bundled' else 'random'} {c.n_layer}L/{c.n_head}H/{c.n_embd}d"
    context = f"{len(prompt)} + {len(reply)}"
    reps = f"{args.reps} reps"
    spread = f"{reps}, range {min(cold):.3g}–{max(cold):.3g}"
    return [[label, "JSON, cold (the job runs)", context, common.median(cold), spread],
            [label, f"JSON, the reply's KV cache kept ({len(prompt) - 1} positions reused)", context,
             common.median(kept), reps],
            [label, "the job alone, cold (calling thread)", context, common.median(bare), reps],
            [label, "JSON again (kept)", context, common.median(again), f"{reps}; {json_bytes:,} bytes"],
            [label, "page (report kept, rows rendered)", context, common.median(page), f"{reps}; {page_bytes:,} bytes"],
            [label, "page again (rows kept)", context, common.median(page_again), reps]]


def main(argv=None):
    args = parse_args(argv)
    load_before = common.load_average()
    rows = [row for name in args.models for row in measure(name, args)]
    body = (common.table(["model", "case", "prompt + reply tokens", "seconds", "reps"], rows)
            + f"\n\n- {args.dtype}; GETs through the app's test client on a share link (job queued on the core, "
              "run, answered); the JSON and page sizes uncompressed")
    common.report(f"The logit lens over a whole reply, {args.dtype}", body, load_before=load_before,
                  write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
