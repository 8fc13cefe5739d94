"""The served path: one reply through gunicorn (and nginx) over SSE, against the bare generator on the
same model, on the main thread and on a worker thread.

    .venv/bin/python -m bench.served                        # 254M config, 200 new tokens, 3 rounds
    .venv/bin/python -m bench.served --size gpt2 --reps 1 --no-doc

The model is random (fixed seed), saved as a checkpoint that gunicorn loads through the app's own loader
with GLASSBOX_CHAT_FACTORY=bench.served:build_model, which masks the special ids so every reply runs to
max_new_tokens. The bench process loads the same checkpoint the same way for the bare runs.

Per round, interleaved: bare generator on the main thread, bare generator on a worker thread (as the
core runs it), one reply straight from gunicorn, one through nginx. The served rate is what the client
sees: (tokens - 1) / (last token event - first token event); the generator's own rate on the server
(saved with the reply) is shown beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path

import torch

from bench import common

FIRST_SPECIAL = 50257


def build_model(arch: str):
    """GLASSBOX_CHAT_FACTORY for this benchmark: the preset GPT (on meta: the loader assigns the weights)
    whose logits never pick a special id, so a reply always runs to max_new_tokens."""
    from webapp.chat.model import GPT, PRESETS
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
            "GLASSBOX_CHAT_FACTORY": "bench.served:build_model"}


def bare(loaded, ids, new_tokens, seed):
    from webapp.chat.generate import generate
    stats = None
    for piece in generate(loaded, ids, max_new_tokens=new_tokens, seed=seed):
        stats = piece.stats or stats
    return stats.decode_tokens_per_s


class Worker:
    """One long-lived thread that runs what it is given, like the core's worker."""

    def __init__(self, torch_threads: int = 0):
        import queue
        self.jobs, self.results = queue.Queue(), queue.Queue()
        self.torch_threads = torch_threads
        threading.Thread(target=self._loop, daemon=True, name="bench-worker").start()

    def _loop(self):
        if self.torch_threads:
            torch.set_num_threads(self.torch_threads)  # what the core does with GLASSBOX_TORCH_THREADS
        while True:
            fn = self.jobs.get()
            try:
                self.results.put((fn(), None))
            except Exception as e:  # noqa: BLE001 - handed back to the caller
                self.results.put((None, e))

    def run(self, fn):
        self.jobs.put(fn)
        value, error = self.results.get()
        if error:
            raise error
        return value


def served(base_url: str, prefix: str, instance: Path, message: str, new_tokens: int):
    """-> (client-side tokens/s, the server generator's own tokens/s, tokens)."""
    from tests.support.servers import Client
    client = Client(base_url)
    client.get(f"{prefix}/chat/")
    reply = client.post(f"{prefix}/chat/send", {"content": message, "max_new_tokens": str(new_tokens)}, htmx=True)
    assert reply.status == 200, reply.text[:500]
    import re
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
                   help="GLASSBOX_TORCH_THREADS for gunicorn and the bench worker (0: the app's default)")
    p.add_argument("--no-nginx", action="store_true")
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from tests.support.servers import NGINX, Gunicorn, Nginx
    from webapp.chat.loading import load_chat_model
    load_before = common.load_average()
    work = Path(tempfile.mkdtemp(prefix="glassbox-served-"))
    checkpoint = write_checkpoint(work, args.size)
    env = {**model_env(checkpoint, args.size), "GLASSBOX_TORCH_THREADS": str(args.torch_threads)}
    app = Gunicorn(work / "instance", env).start(ready_timeout=300)
    use_nginx = not args.no_nginx and (os.path.exists(NGINX))
    proxy = Nginx(work / "nginx", app.port).start() if use_nginx else None
    try:
        loaded = load_chat_model(str(checkpoint), arch=args.size, factory="bench.served:build_model")
        worker = Worker(args.torch_threads)
        rows = {"bare, main thread": [], "bare, worker thread": [], "gunicorn (client)": [],
                "gunicorn (server generator)": [], "nginx (client)": [], "nginx (server generator)": []}
        for r in range(args.reps + 1):  # round 0 warms every path and is not counted
            message = f"Tell me a story about round {r}."
            ids = loaded.prompt.build([{"role": "user", "content": message}], args.new)
            main_rate = bare(loaded, ids, args.new, seed=r)
            worker_rate = worker.run(lambda: bare(loaded, ids, args.new, seed=r))
            g_client, g_server, _ = served(app.url, "", app.instance, message, args.new)
            got = {"bare, main thread": main_rate, "bare, worker thread": worker_rate,
                   "gunicorn (client)": g_client, "gunicorn (server generator)": g_server}
            if proxy is not None:
                n_client, n_server, _ = served(proxy.url, "/glassbox", app.instance, message, args.new)
                got.update({"nginx (client)": n_client, "nginx (server generator)": n_server})
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
            + f"\n\n- model: {args.size}, random weights (seed 0), fp32, {args.new} new tokens per reply, "
            + f"prompt = few-shot + one short message ({len(ids)} tokens); {args.reps} rounds, interleaved, "
            + "after one warm-up round.\n"
            + f"- GLASSBOX_TORCH_THREADS={args.torch_threads or 'unset (default)'}; the bench's main thread uses "
            + f"{torch.get_num_threads()} torch threads; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}.\n")
    common.report("Served path: one reply over SSE vs the bare generator", body, load_before=load_before,
                  write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
