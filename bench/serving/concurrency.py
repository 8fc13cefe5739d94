"""Many users at once: N browsers ask at the same moment for a 128-token reply, through real gunicorn
(and once through nginx), with the batched core and with GLASSBOX_MAX_BATCH=1 (one reply at a time),
same commit, interleaved.

    .venv/bin/python -m bench.serving.concurrency                      # 254M config, N = 1 2 4 8 16, one round
    .venv/bin/python -m bench.serving.concurrency --size gpt2 --users 1 4 --no-doc

Both servers load the same random checkpoint (fixed seed) through the app's own loader with
GLASSBOX_CHAT_FACTORY=bench.serving.served:build_model, which masks the special ids so every reply runs to
max_new_tokens. Each browser has its own cookie jar; all send at once (a barrier), then read their
stream. Per user: time to first token (send -> first token event), tokens/s after the first; overall:
aggregate tokens/s (all tokens / time until the last reply is complete) and that time. Loopback only,
bounded: every request has a timeout and the run stops by itself.

Served against the step (issue 23): after the servers stop, the bare batched decode step
(bench.decode.batch_step's) runs in this process at B = N with the served rows' mean context (their prompts
plus half a reply), and each batched round's aggregate is divided by it. Where the worker's time went
during each batched round (GLASSBOX's /metrics `glassbox_worker_seconds_total`: prefill, decode,
publish, the rest of the step, finishing and saving, admitting) is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import common
from bench.serving.served import model_env, write_checkpoint
from tests.support.servers import Client, Gunicorn, Nginx, parse_metrics

MODES = {"batched": {}, "one at a time": {"GLASSBOX_MAX_BATCH": "1"}}


def one_user(base: str, prefix: str, i: int, new_tokens: int, barrier: threading.Barrier, out: dict) -> None:
    client = Client(base)
    client.get(f"{prefix}/chat/")
    barrier.wait(timeout=120)
    sent = time.perf_counter()
    reply = client.post(f"{prefix}/chat/send", {"content": f"Tell me a story about the number {i}.",
                                                "max_new_tokens": str(new_tokens)}, htmx=True)
    assert reply.status == 200, reply.text[:300]
    url = re.search(r'sse-connect="([^"]+)"', reply.text).group(1)
    stamps = [e.at for e in client.open_stream(url, timeout=1800).events() if e.name == "token"]
    out[i] = {"sent": sent, "first": stamps[0], "last": stamps[-1],
              "message": int(re.search(r"/m/(\d+)/", url).group(1))}


def worker_seconds(server: Gunicorn) -> dict[str, float]:
    """The core worker's seconds so far by phase, and its decoding steps and their rows, from /metrics."""
    metrics = parse_metrics(Client(server.url).get("/metrics").text)
    found = (re.fullmatch(r'glassbox_worker_seconds_total\{phase="([^"]+)"\}', k) for k in metrics)
    return {**{m.group(1): metrics[m.group(0)] for m in found if m},
            "steps": metrics.get("glassbox_batch_rows_count", 0.0), "rows": metrics.get("glassbox_batch_rows_sum", 0.0)}


def round_of(server: Gunicorn, base: str, prefix: str, users: int, new_tokens: int) -> dict:
    before = worker_seconds(server)
    barrier, out = threading.Barrier(users), {}
    threads = [threading.Thread(target=one_user, args=(base, prefix, i, new_tokens, barrier, out))
               for i in range(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(1800)
    assert len(out) == users, f"{users - len(out)} users got no reply"
    with sqlite3.connect(server.instance / "glassbox.sqlite3") as db:
        tokens = {i: db.execute("SELECT tokens, status FROM messages WHERE id = ?", (u["message"],)).fetchone()
                  for i, u in out.items()}
        prompts = [len(json.loads(db.execute("SELECT prompt FROM reply_details WHERE message_id = ?",
                                             (u["message"],)).fetchone()[0])["ids"]) for u in out.values()]
    after = worker_seconds(server)
    steps = max(1.0, after["steps"] - before["steps"])
    assert all(t == (new_tokens, "complete") for t in tokens.values()), tokens
    start = min(u["sent"] for u in out.values())
    ttft = [u["first"] - u["sent"] for u in out.values()]
    rates = [(new_tokens - 1) / (u["last"] - u["first"]) for u in out.values()]
    end = max(u["last"] for u in out.values()) - start
    return {"ttft_median": common.median(ttft), "ttft_p95": sorted(ttft)[max(0, round(0.95 * len(ttft)) - 1)],
            "user_rate": common.median(rates), "aggregate": users * new_tokens / end, "last_done": end,
            "prompt": sum(prompts) / len(prompts),
            "decode ms": 1000 * (after.get("decode", 0.0) - before.get("decode", 0.0)) / steps,
            "rows per step": (after["rows"] - before["rows"]) / steps,
            **{f"worker {k}": (after.get(k, 0.0) - before.get(k, 0.0)) / end for k in after if k in PHASES}}


def step_seconds(model, batch: int, context: int, steps: int = 7) -> float:
    """Seconds of the bare batched decode step at this batch and context (bench.decode.batch_step's rows)."""
    import torch

    from bench.decode.batch_step import caches_for
    idx, caches, positions = caches_for(model, batch, context, torch.device("cpu"))
    times = []
    with torch.inference_mode():
        for _ in range(steps + 1):  # the first is a warm-up
            started = time.perf_counter()
            model.decode_step(idx, caches, positions)
            times.append(time.perf_counter() - started)
    return common.median(times[1:])


PHASES = ("prefill", "decode", "publish", "step other", "finish", "admit")  # the worker's busy time


def against_the_step(args, served: list[tuple[int, str, dict]]) -> str:
    """Each batched round's aggregate ÷ the bare step's tokens/s at B = N and the rows' mean context (timed
    right after that round), and where the worker's time went in that round (shares of its wall time)."""
    rows = []
    for users, via, med in served:
        step = users / med["step s"]
        rows.append([users, via, round(med["prompt"] + args.new / 2), med["aggregate"], step, med["aggregate"] / step,
                     med["ttft_p95"], 1000 * med["step s"], med["decode ms"], med["rows per step"]]
                    + [100 * med.get(f"worker {phase}", 0.0) for phase in PHASES])
    return ("Served against the bare batched step (bench.decode.batch_step's decode_step in this process, the servers "
            "idle, right after each round) at B = N and the served rows' mean context (prompt + half a reply); the "
            "worker's time in each round as % of the round's wall time (/metrics glassbox_worker_seconds_total), and "
            "its decoding steps' mean time and rows (fewer rows than N: the batch filling up or emptying).\n\n"
            + common.table(["N", "via", "context", "served tokens/s", "step tokens/s", "served / step",
                            "TTFT p95 s", "bare step ms", "served decode ms per step", "served rows per step"]
                           + [f"% {phase}" for phase in PHASES], rows))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="gpt2-254m")
    p.add_argument("--users", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--new", type=int, default=128, help="tokens per reply")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--nginx-users", type=int, default=8, help="N for the one round through nginx (0: none)")
    p.add_argument("--baseline", default="", help="a git revision: also time N=1 on it (a worktree), interleaved")
    p.add_argument("--baseline-all", action="store_true", help="time every N on the --baseline revision, not only 1")
    p.add_argument("--batched-only", action="store_true", help="skip GLASSBOX_MAX_BATCH=1 (one at a time)")
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args(argv)
    modes = {"batched": MODES["batched"]} if args.batched_only else MODES
    load_before = common.load_average()
    results: dict[tuple[str, int, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "model").mkdir()
        checkpoint = write_checkpoint(tmp / "model", args.size)
        env = {**model_env(checkpoint, args.size), "GLASSBOX_TORCH_THREADS": "0", "GLASSBOX_MAX_STREAMS": "40",
               "GLASSBOX_MAX_STREAMS_PER_CLIENT": "0", "GLASSBOX_MAX_JOBS_PER_CLIENT": "0",  # all users share 127.0.0.1
               "GLASSBOX_MAX_QUEUE": "64"}
        servers = {mode: Gunicorn(tmp / mode.replace(" ", "_"), {**env, **extra}).start(ready_timeout=600)
                   for mode, extra in modes.items()}
        if args.baseline:  # the same model on an older revision, for N=1 only
            old = tmp / "baseline-tree"
            subprocess.run(["git", "worktree", "add", "--detach", str(old), args.baseline], cwd=common.ROOT, check=True)
            baseline = Gunicorn(tmp / "baseline", env, root=old).start(ready_timeout=600)
        nginx, model = None, None
        try:
            for _ in range(args.reps):
                for users in args.users:
                    for mode, server in servers.items():  # interleaved: each N runs both ways back to back
                        r = round_of(server, server.url, "", users, args.new)
                        if mode == "batched":  # the bare step at this B and context, in the same minutes
                            model = model or common.random_gpt(args.size, seed=0).eval()  # the servers' weights
                            r["step s"] = step_seconds(model, users, round(r["prompt"] + args.new / 2))
                        results.setdefault((mode, users, "gunicorn"), []).append(r)
                        print(mode, users, {k: round(v, 2) for k, v in r.items()}, flush=True)
                    if args.baseline and (users == 1 or args.baseline_all):
                        r = round_of(baseline, baseline.url, "", users, args.new)
                        results.setdefault((f"revision {args.baseline}", users, "gunicorn"), []).append(r)
                        print("baseline", {k: round(v, 2) for k, v in r.items()}, flush=True)
            if args.nginx_users:
                nginx = Nginx(tmp / "nginx", servers["batched"].port).start()
                r = round_of(servers["batched"], nginx.url + "/glassbox", "", args.nginx_users, args.new)
                model = model or common.random_gpt(args.size, seed=0).eval()
                r["step s"] = step_seconds(model, args.nginx_users, round(r["prompt"] + args.new / 2))
                results[("batched", args.nginx_users, "nginx")] = [r]
                print("nginx", args.nginx_users, {k: round(v, 2) for k, v in r.items()}, flush=True)
        finally:
            if nginx is not None:
                nginx.stop()
            for server in servers.values():
                server.stop()
            if args.baseline:
                baseline.stop()
                subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=common.ROOT)
    rows, base, served = [], {}, []
    for (mode, users, via), runs in results.items():
        med = {k: common.median([r.get(k, float("nan")) for r in runs]) for k in runs[0]}
        if mode == "batched":
            served.append((users, via, med))
        if users == 1:
            base[mode] = med["aggregate"]
        rows.append([mode, users, via, med["ttft_median"], med["ttft_p95"], med["user_rate"], med["aggregate"],
                     med["aggregate"] / base.get(mode, float("nan")), med["last_done"]])
    table = common.table(["mode", "N", "via", "TTFT median s", "TTFT p95 s", "per-user tokens/s", "aggregate tokens/s",
                          "aggregate / N=1", "last reply done s"], rows)
    one = {u: results.get(("one at a time", u, "gunicorn")) for u in args.users}
    body_extra = []
    for u in args.users:  # against the baseline revision, where it ran at this N
        old, new = results.get((f"revision {args.baseline}", u, "gunicorn")), results.get(("batched", u, "gunicorn"))
        if args.baseline and old and new:
            ratio = {k: common.median([r[k] for r in new]) / common.median([r[k] for r in old])
                     for k in ("user_rate", "aggregate", "ttft_p95")}
            body_extra.append(f"N={u}: batched / revision {args.baseline}: per-user tokens/s {ratio['user_rate']:.2f}, "
                              f"aggregate {ratio['aggregate']:.2f}, TTFT p95 {ratio['ttft_p95']:.2f}")
    def last_done(runs):
        return common.median([r["last_done"] for r in runs])
    ratios = body_extra + [f"N={u}: last reply done batched / one at a time = "
              f"{last_done(results[('batched', u, 'gunicorn')]) / last_done(one[u]):.2f}"
              for u in args.users if one[u]]
    body = (f"{args.size}, {args.new}-token replies, {args.reps} round(s), median per cell.\n\n{table}\n\n"
            + "\n".join(f"- {line}" for line in ratios) + "\n\n" + against_the_step(args, served))
    common.report(f"bench.serving.concurrency: {args.size}, N users at once", body, load_before=load_before,
                  write_doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
