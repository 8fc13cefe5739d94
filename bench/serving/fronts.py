"""One front end against two, on the bundled models, the same load: page latency and streams held.

    .venv/bin/python -m bench.serving.fronts                 # 1 then 2 front ends, 40 browsers, 3 replies each
    .venv/bin/python -m bench.serving.fronts --browsers 20 --markdown

Each run starts a throwaway PostgreSQL cluster (tests/support/postgres.py: Debian's server binaries), N
gunicorn front ends (gunicorn.conf.py) on one fresh database and nginx before them with deploy/nginx.conf's
routing (N upstream lines). Then `--browsers` browsers, each with its own cookie, all at once: load the chat
page, then `--rounds` times send a question, open the reply's stream and read it to its end; meanwhile
`--page-clients` others load the chat page over and over. Figures: how many streams were open at once
(held), how many were refused (503 "Too many open streams"), replies completed, and the page loads'
latency (p50, p95, max).

Every browser comes from 127.0.0.1, so the per-address limits are lifted (GLASSBOX_MAX_STREAMS_PER_CLIENT,
GLASSBOX_MAX_JOBS_PER_CLIENT, GLASSBOX_MAX_NEW_SESSIONS_PER_MINUTE = 0; nginx's limit_req lines dropped):
what is measured is the front ends' own limits (GLASSBOX_MAX_STREAMS each) and their CPU.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.support.postgres import Cluster, server_binaries
from tests.support.servers import ROOT, Client, Gunicorn, Nginx, stream_url

PREFIX = "/glassbox"
QUESTIONS = ["What is the capital of Japan?", "What is 12 plus 30?", "Hello!", "What is the chemical symbol for gold?",
             "What is Glassbox?", "What is the capital of France?", "What is 7 plus 8?", "Who are you?"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open = self.held = self.refused = self.completed = self.failed = 0
        self.errors: list[str] = []

    def opened(self) -> None:
        with self.lock:
            self.open += 1
            self.held = max(self.held, self.open)

    def closed(self) -> None:
        with self.lock:
            self.open -= 1

    def add(self, name: str, error: str = "") -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)
            if error and len(self.errors) < 5:
                self.errors.append(error)


def browser(base: str, index: int, tokens: int, rounds: int, start: threading.Event, tally: Tally) -> None:
    client = Client(base)
    client.get(f"{PREFIX}/chat/")
    start.wait()
    for _ in range(rounds):
        one_reply(client, index, tokens, tally)


def one_reply(client: Client, index: int, tokens: int, tally: Tally) -> None:
    try:
        sent = client.post(f"{PREFIX}/chat/send", {"content": QUESTIONS[index % len(QUESTIONS)],
                                                   "max_new_tokens": str(tokens), "temperature": "0"},
                           htmx=True, timeout=120)
        if sent.status != 200:
            tally.add("failed", f"send {sent.status}: {sent.text[:120]}")
            return
        stream = client.open_stream(stream_url(sent.text), timeout=300)
        if stream.status != 200:
            tally.add("refused" if stream.status == 503 else "failed", f"stream {stream.status}")
            return
        tally.opened()
        try:
            events = list(stream.events())
        finally:
            tally.closed()
        ok = events and events[-1].name == "done" and "complete" in events[-1].data
        tally.add("completed" if ok else "failed", "" if ok else f"ended {events[-1:]!r:.120}")
    except Exception as error:  # a figure, not a crash: counted and shown
        tally.add("failed", f"{type(error).__name__}: {error}")


def page_loader(base: str, stop: threading.Event, latencies: list[float], pause: float) -> None:
    client = Client(base)
    client.get(f"{PREFIX}/chat/")
    while not stop.is_set():
        began = time.perf_counter()
        reply = client.get(f"{PREFIX}/chat/", timeout=60)
        if reply.status == 200:
            latencies.append(time.perf_counter() - began)
        time.sleep(pause)


def unlimited_site(folder: Path) -> Path:
    """deploy/nginx.conf without its per-address request limit (every browser here is 127.0.0.1)."""
    site = (ROOT / "deploy" / "nginx.conf").read_text()
    site = re.sub(r"^\s*limit_req[^\n]*\n", "", site, flags=re.M)
    path = folder / "nginx-site.conf"
    path.write_text(site)
    return path


def run(cluster: Cluster, fronts: int, args, work: Path) -> dict:
    database = cluster.new_database()
    env = {"GLASSBOX_DATABASE_URL": database, "GLASSBOX_SECRET_KEY": "bench-fronts-" + "k" * 32,
           "GLASSBOX_MAX_STREAMS_PER_CLIENT": "0", "GLASSBOX_MAX_JOBS_PER_CLIENT": "0",
           "GLASSBOX_MAX_NEW_SESSIONS_PER_MINUTE": "0", "GLASSBOX_LOG_LEVEL": "warning"}
    servers = [Gunicorn(work / f"front{fronts}-{i}", env) for i in range(fronts)]
    proxy = None
    try:
        for server in servers:
            server.start(ready_timeout=300)
        proxy = Nginx(work / f"nginx{fronts}", [s.port for s in servers], template=unlimited_site(work)).start()
        tally, latencies, start, stop = Tally(), [], threading.Event(), threading.Event()
        loaders = [threading.Thread(target=page_loader, args=(proxy.url, stop, latencies, args.page_pause))
                   for _ in range(args.page_clients)]
        users = [threading.Thread(target=browser, args=(proxy.url, i, args.tokens, args.rounds, start, tally))
                 for i in range(args.browsers)]
        for thread in loaders + users:
            thread.start()
        time.sleep(1.0)  # every browser has its cookie; the page loaders have a quiet second first
        quiet = len(latencies)
        began = time.perf_counter()
        start.set()
        for thread in users:
            thread.join(args.time_limit)
        took = time.perf_counter() - began
        stop.set()
        for thread in loaders:
            thread.join(60)
        loaded = latencies[quiet:]
        return {"front_ends": fronts, "browsers": args.browsers, "rounds": args.rounds, "tokens": args.tokens,
                "seconds": round(took, 1),
                "streams_held": tally.held, "streams_refused": tally.refused, "completed": tally.completed,
                "failed": tally.failed, "errors": tally.errors, "page_loads": len(loaded),
                "page_p50_ms": round(1000 * statistics.median(loaded), 1) if loaded else None,
                "page_p95_ms": round(1000 * percentile(loaded, 0.95), 1) if loaded else None,
                "page_max_ms": round(1000 * max(loaded), 1) if loaded else None}
    finally:
        if proxy:
            proxy.stop()
        for server in servers:
            server.stop()
        cluster.drop_database(database)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--browsers", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=200, help="max_new_tokens of each reply")
    parser.add_argument("--rounds", type=int, default=3, help="replies each browser asks for, one after another")
    parser.add_argument("--page-clients", type=int, default=2)
    parser.add_argument("--page-pause", type=float, default=0.1)
    parser.add_argument("--fronts", default="1,2", help="front-end counts to run, in turn")
    parser.add_argument("--time-limit", type=float, default=300)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", action="store_true", help="print a table for docs/benchmarks-history.md")
    args = parser.parse_args()
    if args.browsers > 120 or args.time_limit > 900:
        parser.error("bounded on purpose: at most 120 browsers and 900 s")
    binaries = server_binaries()
    if binaries is None:
        parser.error("PostgreSQL is not installed (make system-packages-test installs Debian's postgresql)")
    work = Path(tempfile.mkdtemp(prefix="glassbox-fronts-"))
    cluster = Cluster(binaries).start()
    results = []
    try:
        for fronts in [int(n) for n in args.fronts.split(",")]:
            result = run(cluster, fronts, args, work)
            print(json.dumps(result), flush=True)
            results.append(result)
    finally:
        cluster.remove()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.markdown:
        revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                  cwd=ROOT).stdout.strip()
        print(f"\n`.venv/bin/python -m bench.serving.fronts {' '.join(sys.argv[1:])}` at {revision}\n")
        print("| front ends | browsers x replies | streams held at once | refused (503) | replies complete | failed "
              "| page p50 ms | page p95 ms | page max ms | seconds |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in results:
            print(f"| {r['front_ends']} | {r['browsers']} x {r['rounds']} | {r['streams_held']} "
                  f"| {r['streams_refused']} | {r['completed']} | {r['failed']} | {r['page_p50_ms']} "
                  f"| {r['page_p95_ms']} | {r['page_max_ms']} | {r['seconds']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
