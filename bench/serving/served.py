"""The served path: one reply through gunicorn (and nginx) over SSE, against the bare generator on the
same model, on the main thread and on a worker thread.

    .venv/bin/python -m bench.serving.served                        # 254M config, 200 new tokens, 3 rounds
    .venv/bin/python -m bench.serving.served --size gpt2 --reps 1 --no-doc

The model is random (fixed seed), saved as a checkpoint that gunicorn loads through the app's own loader
with GLASSBOX_CHAT_FACTORY=bench.serving.served:build_model, which masks the special ids so every reply runs to
max_new_tokens. The bare runs load the same checkpoint the same way (webapp.chat.service.load_model).

Per round, interleaved: the bare generator in fresh processes (so no other thread of theirs has an
OpenMP pool unless the mode says so) - on the main thread; on a worker thread, as the core runs it; on a
worker after the main thread ran parallel torch work (two pools: libgomp's threads then sleep between
operations); the same after that work ran under webapp.core.threads.one_torch_thread (what load_model
does now) - then one reply straight from gunicorn and one through nginx. The served rate is what the
client sees: (tokens - 1) / (last token event - first token event); the generator's own rate on the
server (saved with the reply) is shown beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path

import torch

from bench import common

FIRST_SPECIAL = 50257
MODES = {
    "bare, main thread": "main",
    "bare, worker thread": "worker",
    "bare, worker thread; main thread ran parallel torch work first": "worker-after-pool",
    "bare, worker thread; that work under one_torch_thread()": "worker-after-guarded",
}


def build_model(arch: str):
    """GLASSBOX_CHAT_FACTORY for this benchmark: the preset GPT (on meta: the loader assigns the weights)
    whose logits never pick a special id, so a reply always runs to max_new_tokens."""
    from webapp.chat.model.gpt import GPT, PRESETS
    with torch.device("meta"):
        model = GPT(PRESETS[arch])
    model.lm_head.register_forward_hook(_no_specials)
    return model


def _no_specials(module, args, logits):
    logits[..., FIRST_SPECIAL:] = float("-inf")
    return logits


def write_checkpoint(directory: Path, size: str) -> Path:
    from safetensors.torch import save_file
    model = common.random_gpt(size, seed=0)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
    path = directory / "model.safetensors"
    save_file(state, str(path))
    (directory / "config.json").write_text(json.dumps({**asdict(model.config),
                                                       "tokenizer": f"gpt2:{common.GPT2_RANKS}"}))
    return path


def model_env(checkpoint: Path, size: str) -> dict:
    return {"GLASSBOX_CHAT_CHECKPOINT": str(checkpoint), "GLASSBOX_CHAT_ARCH": size,
            "GLASSBOX_CHAT_FACTORY": "bench.serving.served:build_model"}


def child(mode: str, checkpoint: str, size: str, new_tokens: int, seed: int) -> None:
    """One bare reply in this fresh process; prints its decode tokens/s as the last line."""
    from webapp.chat.boot import load_model
    from webapp.chat.decode.generate import generate
    from webapp.config import Settings
    from webapp.core.threads import one_torch_thread
    loaded = load_model(Settings(chat_checkpoint=checkpoint, chat_arch=size,
                                 chat_factory="bench.serving.served:build_model"))
    ids = loaded.prompt.build([{"role": "user", "content": f"Tell me a story about round {seed}."}], new_tokens)

    def reply(n):
        stats = None
        for piece in generate(loaded, ids, max_new_tokens=n, seed=seed):
            stats = piece.stats or stats
        return stats.decode_tokens_per_s

    def work():  # big enough that torch splits it between threads
        torch.randn(1 << 22).mul_(2)

    if mode == "worker-after-pool":
        work()
    elif mode == "worker-after-guarded":
        with one_torch_thread():
            work()
    if mode == "main":
        reply(8)
        rate = reply(new_tokens)
    else:
        out = {}
        thread = threading.Thread(target=lambda: (reply(8), out.update(rate=reply(new_tokens))))
        thread.start()
        thread.join()
        rate = out["rate"]
    print(json.dumps({"rate": rate, "threads": len(os.listdir("/proc/self/task"))}))


def bare(mode: str, checkpoint: Path, size: str, new_tokens: int, seed: int) -> float:
    cmd = [sys.executable, "-m", "bench.serving.served", "--child", mode, "--checkpoint", str(checkpoint),
           "--size", size, "--new", str(new_tokens), "--seed", str(seed)]
    done = subprocess.run(cmd, cwd=common.ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["rate"]


def served(base_url: str, prefix: str, instance: Path, message: str, new_tokens: int):
    """-> (client-side tokens/s, the server generator's own tokens/s, tokens)."""
    from tests.support.servers import Client
    client = Client(base_url)
    client.get(f"{prefix}/chat/")
    reply = client.post(f"{prefix}/chat/send", {"content": message, "max_new_tokens": str(new_tokens)}, htmx=True)
    assert reply.status == 200, reply.text[:500]
    url = re.search(r'sse-connect="([^"]+)"', reply.text).group(1)
    stamps = [e.at for e in client.open_stream(url, timeout=600).events() if e.name == "token"]
    message_id = int(re.search(r"/m/(\d+)/stream", url).group(1))
    with sqlite3.connect(instance / "glassbox.sqlite3") as db:
        tokens, server_rate, status = db.execute(
            "SELECT tokens, tokens_per_second, status FROM messages WHERE id = ?", (message_id,)).fetchone()
    assert status == "complete" and tokens == new_tokens, (status, tokens)
    # token events carry text; a token inside a multi-byte character sends none, so time the first and
    # last events and count the tokens the server saved
    return (tokens - 1) / (stamps[-1] - stamps[0]), server_rate, tokens


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="gpt2-254m")
    p.add_argument("--new", type=int, default=200)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--torch-threads", type=int, default=0,
                   help="GLASSBOX_TORCH_THREADS for gunicorn (0: the app's default)")
    p.add_argument("--no-nginx", action="store_true")
    p.add_argument("--no-doc", action="store_true")
    p.add_argument("--child", choices=sorted(MODES.values()), help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        return child(args.child, args.checkpoint, args.size, args.new, args.seed)
    from tests.support.servers import NGINX, Gunicorn, Nginx
    load_before = common.load_average()
    work = Path(tempfile.mkdtemp(prefix="glassbox-served-"))
    checkpoint = write_checkpoint(work, args.size)
    env = {**model_env(checkpoint, args.size), "GLASSBOX_TORCH_THREADS": str(args.torch_threads)}
    app = Gunicorn(work / "instance", env).start(ready_timeout=300)
    proxy = Nginx(work / "nginx", app.port).start() if not args.no_nginx and os.path.exists(NGINX) else None
    rows = {name: [] for name in [*MODES, "gunicorn (client)", "gunicorn (server generator)", "nginx (client)",
                                  "nginx (server generator)"]}
    try:
        for r in range(args.reps + 1):  # round 0 warms gunicorn (and the page cache) and is not counted
            message = f"Tell me a story about round {r}."
            got = {name: bare(mode, checkpoint, args.size, args.new, r) for name, mode in MODES.items()} if r else {}
            got["gunicorn (client)"], got["gunicorn (server generator)"], _ = served(
                app.url, "", app.instance, message, args.new)
            if proxy is not None:
                got["nginx (client)"], got["nginx (server generator)"], _ = served(
                    proxy.url, "/glassbox", app.instance, message, args.new)
            print(f"  round {r}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()), flush=True)
            if r:
                for k, v in got.items():
                    rows[k].append(v)
    finally:
        if proxy is not None:
            proxy.stop()
        app.stop()

    main_rate = common.median(rows["bare, main thread"])
    worker_rate = common.median(rows["bare, worker thread"])
    table = [[k, len(v), common.median(v), common.median(v) / main_rate, common.median(v) / worker_rate]
             for k, v in rows.items() if v]
    body = (common.table(["path", "replies", "decode tok/s (median)", "÷ bare main thread",
                          "÷ bare worker thread"], table)
            + f"\n\n- model: {args.size}, random weights (seed 0), fp32, {args.new} new tokens per reply, prompt = "
            + f"few-shot + one short message; {args.reps} rounds, interleaved, after a warm-up round; every bare "
            + "run in a fresh process (load, 8-token warm-up, the timed reply).\n"
            + f"- GLASSBOX_TORCH_THREADS={args.torch_threads or 'unset (default)'}; "
            + f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}.\n")
    common.report("Served path: one reply over SSE vs the bare generator", body, load_before=load_before,
                  write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
