"""Many users at once: N browsers ask at the same moment for a 128-token reply, through real gunicorn
(and once through nginx), with the batched core and with GLASSBOX_MAX_BATCH=1 (one reply at a time),
same commit, interleaved.

    .venv/bin/python -m bench.concurrency                      # 254M config, N = 1 2 4 8 16, one round
    .venv/bin/python -m bench.concurrency --size gpt2 --users 1 4 --no-doc

Both servers load the same random checkpoint (fixed seed) through the app's own loader with
GLASSBOX_CHAT_FACTORY=bench.served:build_model, which masks the special ids so every reply runs to
max_new_tokens. Each browser has its own cookie jar; all send at once (a barrier), then read their
stream. Per user: time to first token (send -> first token event), tokens/s after the first; overall:
aggregate tokens/s (all tokens / time until the last reply is complete) and that time. Loopback only,
bounded: every request has a timeout and the run stops by itself.
"""

from __future__ import annotations

import argparse
import re
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import common
from bench.served import model_env, write_checkpoint
from tests.support.servers import Client, Gunicorn, Nginx

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


def round_of(server: Gunicorn, base: str, prefix: str, users: int, new_tokens: int) -> dict:
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
    assert all(t == (new_tokens, "complete") for t in tokens.values()), tokens
    start = min(u["sent"] for u in out.values())
    ttft = [u["first"] - u["sent"] for u in out.values()]
    rates = [(new_tokens - 1) / (u["last"] - u["first"]) for u in out.values()]
    end = max(u["last"] for u in out.values()) - start
    return {"ttft_median": common.median(ttft), "ttft_p95": sorted(ttft)[max(0, round(0.95 * len(ttft)) - 1)],
            "user_rate": common.median(rates), "aggregate": users * new_tokens / end, "last_done": end}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="gpt2-254m")
    p.add_argument("--users", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--new", type=int, default=128, help="tokens per reply")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--nginx-users", type=int, default=8, help="N for the one round through nginx (0: none)")
    p.add_argument("--baseline", default="", help="a git revision: also time N=1 on it (a worktree), interleaved")
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args(argv)
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
                   for mode, extra in MODES.items()}
        if args.baseline:  # the same model on an older revision, for N=1 only
            old = tmp / "baseline-tree"
            subprocess.run(["git", "worktree", "add", "--detach", str(old), args.baseline], cwd=common.ROOT, check=True)
            baseline = Gunicorn(tmp / "baseline", env, root=old).start(ready_timeout=600)
        nginx = None
        try:
            for _ in range(args.reps):
                for users in args.users:
                    for mode, server in servers.items():  # interleaved: each N runs both ways back to back
                        r = round_of(server, server.url, "", users, args.new)
                        results.setdefault((mode, users, "gunicorn"), []).append(r)
                        print(mode, users, {k: round(v, 2) for k, v in r.items()}, flush=True)
                    if args.baseline and users == 1:
                        r = round_of(baseline, baseline.url, "", 1, args.new)
                        results.setdefault((f"revision {args.baseline}", 1, "gunicorn"), []).append(r)
                        print("baseline", {k: round(v, 2) for k, v in r.items()}, flush=True)
            if args.nginx_users:
                nginx = Nginx(tmp / "nginx", servers["batched"].port).start()
                r = round_of(servers["batched"], nginx.url + "/glassbox", "", args.nginx_users, args.new)
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
    rows, base = [], {}
    for (mode, users, via), runs in results.items():
        med = {k: common.median([r[k] for r in runs]) for k in runs[0]}
        if users == 1:
            base[mode] = med["aggregate"]
        rows.append([mode, users, via, med["ttft_median"], med["ttft_p95"], med["user_rate"], med["aggregate"],
                     med["aggregate"] / base.get(mode, float("nan")), med["last_done"]])
    table = common.table(["mode", "N", "via", "TTFT median s", "TTFT p95 s", "per-user tokens/s", "aggregate tokens/s",
                          "aggregate / N=1", "last reply done s"], rows)
    one = {u: results.get(("one at a time", u, "gunicorn")) for u in args.users}
    if args.baseline:
        old_rate = common.median([r["user_rate"] for r in results[(f"revision {args.baseline}", 1, "gunicorn")]])
        new_rate = common.median([r["user_rate"] for r in results[("batched", 1, "gunicorn")]])
        body_extra = [f"N=1: batched tokens/s / revision {args.baseline} = {new_rate / old_rate:.2f}"]
    else:
        body_extra = []
    def last_done(runs):
        return common.median([r["last_done"] for r in runs])
    ratios = body_extra + [f"N={u}: last reply done batched / one at a time = "
              f"{last_done(results[('batched', u, 'gunicorn')]) / last_done(one[u]):.2f}"
              for u in args.users if one[u]]
    body = (f"{args.size}, {args.new}-token replies, {args.reps} round(s), median per cell.\n\n{table}\n\n"
            + "\n".join(f"- {line}" for line in ratios))
    common.report(f"bench.concurrency: {args.size}, N users at once", body, load_before=load_before,
                  write_doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
