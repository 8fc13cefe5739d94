"""Load and fault run against real gunicorn, on loopback only, bounded in count and time.

    .venv/bin/python -m bench.robustness.load                # starts gunicorn itself on the bundled models
    .venv/bin/python -m bench.robustness.load --models test  # tiny random models, 30 ms a token / 50 ms a loop
    .venv/bin/python -m bench.robustness.load --nginx        # the same, through nginx (deploy/nginx.conf) at /glassbox/
    .venv/bin/python -m bench.robustness.load --url http://127.0.0.1:8000 --instance ./instance   # a running server

16 browsers each ask for a chat reply and 4 run the Loop lab, all at once, while 2 more keep loading
pages; a quarter of the 20 hang up at a random moment. Then it checks, and exits 1 if any check fails:
every job completed or was cancelled, none ran twice, no reply was lost (streams, SQLite and counters
agree), threads are back to their baseline, page loads stayed fast while streams ran, and the queue
positions each stream reported were consistent with the queue's FIFO order.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support.servers import Client, Gunicorn, Nginx, model_env, parse_metrics, stream_url  # noqa: E402

QUESTIONS = ["What is the capital of Japan?", "What is 12 plus 30?", "Hello!", "What is the chemical symbol for gold?",
             "What is Glassbox?", "What is the capital of France?", "What is 7 plus 8?", "Who are you?"]
PAGES = ["/", "/chat/", "/loops/"]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass
class Browser:
    """One simulated colleague: a session, one job, its stream as it arrived."""

    kind: str
    index: int  # submission order, 0-based, over all jobs
    hang_up_after: float | None  # seconds after opening the stream; None = reads to the end
    client: Client = None
    url: str = ""
    events: list = field(default_factory=list)  # (seconds since start, name, data)
    opened: float = 0.0
    closed: float = 0.0
    done: bool = False
    error: str = ""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


class Run:
    def __init__(self, args) -> None:
        self.args, self.t0 = args, time.monotonic()
        self.rng = random.Random(args.seed)
        self.page_times: list[tuple[float, float]] = []  # (started at, seconds)
        self.stop_pages = threading.Event()

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- the load ----------------------------------------------------------------------------
    def browsers(self) -> list[Browser]:
        kinds = ["chat"] * self.args.chats + ["loops"] * self.args.loops
        self.rng.shuffle(kinds)
        quitters = set(self.rng.sample(range(len(kinds)), round(len(kinds) * self.args.disconnect)))
        return [Browser(kind, i, self.rng.uniform(0.05, self.args.hang_up_within) if i in quitters else None)
                for i, kind in enumerate(kinds)]

    def submit(self, b: Browser) -> None:
        b.client = Client(self.args.url)
        if b.kind == "chat":
            b.client.get("/chat/")
            reply = b.client.post("/chat/send", {"content": self.rng.choice(QUESTIONS),
                                                 "max_new_tokens": str(self.args.tokens)}, htmx=True)
        else:
            lab = b.client.get("/loops/")
            src = re.findall(r'name="src" value="([A-Z])"', lab.text)
            dst = [self.rng.choice(src) for _ in src]
            reply = b.client.post("/loops/run", {"src": src, "dst": dst, "start": self.rng.choice(src),
                                                 "steps": str(self.rng.randint(4, 24))}, htmx=True)
        if reply.status != 200:
            raise SystemExit(f"submitting {b.kind} #{b.index} failed: {reply.status} {reply.text[:300]}")
        b.url = stream_url(reply.text)

    def read(self, b: Browser) -> None:
        b.opened = self.now()
        try:
            stream = b.client.open_stream(b.url, timeout=self.args.time_limit)
            for event in stream.events():
                b.events.append((event.at - self.t0, event.name, event.data))
                b.done = event.name == "done"
                if b.hang_up_after is not None and self.now() - b.opened >= b.hang_up_after:
                    break
                if self.now() > self.args.time_limit:
                    b.error = "time limit"
                    break
            stream.close()
        except OSError as error:
            b.error = f"{type(error).__name__}: {error}"
        b.closed = self.now()

    def load_pages(self) -> None:
        client = Client(self.args.url)
        while not self.stop_pages.is_set() and self.now() < self.args.time_limit:
            started = time.monotonic()
            reply = client.get(self.rng.choice(PAGES))
            if reply.status == 200:
                self.page_times.append((started - self.t0, time.monotonic() - started))
            time.sleep(self.args.page_pause)

    def go(self) -> dict:
        metrics_before = self.metrics()
        baseline = self.page_baseline()
        browsers = self.browsers()
        pages = [threading.Thread(target=self.load_pages, daemon=True) for _ in range(self.args.page_clients)]
        for thread in pages:
            thread.start()
        submitted_at = []
        for b in browsers:  # one after the other, so the server's queue order is this order
            self.submit(b)
            submitted_at.append(self.now())
        readers = [threading.Thread(target=self.read, args=(b,), daemon=True) for b in browsers]
        for thread in readers:
            thread.start()
        for thread in readers:
            thread.join(max(1.0, self.args.time_limit - self.now()))
        streams_ended = self.now()
        settled = self.wait_idle()
        self.stop_pages.set()
        for thread in pages:
            thread.join(10)
        time.sleep(1.5)  # let the last keep-alive connections go back to the pool
        return {"browsers": browsers, "before": metrics_before, "after": self.metrics(), "settled": settled,
                "baseline_pages": baseline, "streams": (submitted_at[0], streams_ended)}

    def page_baseline(self, n: int = 30) -> list[float]:
        client, times = Client(self.args.url), []
        for i in range(n):
            started = time.monotonic()
            client.get(PAGES[i % len(PAGES)])
            times.append(time.monotonic() - started)
        return times

    def metrics(self) -> dict:
        return parse_metrics(Client(self.args.url).get("/metrics").text)

    def wait_idle(self, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = self.metrics()
            if m["glassbox_queue_length"] == 0 and m["glassbox_running_jobs"] == 0 and m["glassbox_open_streams"] == 0:
                return True
            time.sleep(0.2)
        return False


# -- the checks ------------------------------------------------------------------------------------
def check(run: Run, result: dict, instance: Path | None, server_log: str | None) -> tuple[list, dict]:
    browsers, before, after = result["browsers"], result["before"], result["after"]
    checks, figures = [], {}

    def ok(name: str, passed: bool, detail: str = "") -> None:
        checks.append((name, bool(passed), detail))

    def delta(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    submitted, done, cancelled, failed = (delta(f'glassbox_jobs_total{{outcome="{o}"}}')
                                          for o in ("submitted", "done", "cancelled", "failed"))
    figures.update(jobs=len(browsers), done=int(done), cancelled=int(cancelled), failed=int(failed),
                   hung_up=sum(b.hang_up_after is not None for b in browsers))
    ok("every job completed or was cancelled", submitted == len(browsers) == done + cancelled and failed == 0
       and result["settled"],
       f"submitted {submitted:.0f}, done {done:.0f}, cancelled {cancelled:.0f}, failed {failed:.0f}")
    readers_ok = [b for b in browsers if b.hang_up_after is None]
    ok("every stream that was read to the end ended with `done`", all(b.done and not b.error for b in readers_ok),
       "; ".join(f"#{b.index} {b.error}" for b in readers_ok if not b.done or b.error))

    # Nothing ran twice: re-opening every stream replays what happened (a saved reply, or a finished
    # run's log while the server still holds it) and ends; no counter moves.
    replays = [list(b.client.open_stream(b.url).events()) for b in browsers]
    again = run.metrics()
    moved = [n for n in ('glassbox_jobs_total{outcome="submitted"}', "glassbox_tokens_total",
                         "glassbox_loop_rows_total") if again[n] != after[n]]
    ok("re-opened streams replay and end; nothing runs again", all(r and r[-1].name == "done" for r in replays)
       and not moved, f"counters moved: {moved}" if moved else "")
    if server_log is not None:
        jobs = re.findall(r"job id=(\w+) seq=(\d+) kind=\w+ outcome=\w+ wait_ms=\d+ run_ms=(\d+|-)", server_log)
        ids = [job_id for job_id, _, _ in jobs]
        ok("one job-log line per job, no job twice", len(ids) == len(set(ids)) == len(browsers), f"{len(ids)} lines")
        # One worker: jobs that ran are logged in the order they ran, which must be submission order.
        ran = [int(seq) for _, seq, run_ms in jobs if run_ms != "-"]
        ok("jobs ran in submission order (FIFO, from the job log)", ran == sorted(ran), f"{len(ran)} ran")
        waits = [int(w) for w in re.findall(r"job id=\w+ seq=\d+ kind=\w+ outcome=\w+ wait_ms=(\d+)", server_log)]
        runs = [int(r) for _, _, r in jobs if r != "-"]
        figures.update(queue_wait_p50_ms=percentile(waits, 0.5), queue_wait_max_ms=max(waits, default=0),
                       run_p50_ms=percentile(runs, 0.5))

    if instance is not None:
        check_saved(ok, browsers, instance, delta("glassbox_tokens_total"))

    # Threads: the request pool is bounded by gunicorn's `threads`; nothing else is left behind.
    other = ('glassbox_threads{kind="other"}', 'glassbox_threads{kind="request_pool"}')
    figures.update(threads_other=(before[other[0]], after[other[0]]), threads_pool=(before[other[1]], after[other[1]]))
    ok("threads back to baseline (all but gunicorn's bounded request pool)",
       after[other[0]] == before[other[0]] and after[other[1]] <= run.args.threads
       and after["glassbox_open_streams"] == 0,
       f"other {before[other[0]]:.0f} -> {after[other[0]]:.0f}, pool {before[other[1]]:.0f} -> {after[other[1]]:.0f}")

    # Page loads while streams were open.
    first, last = result["streams"]
    during = [s for at, s in run.page_times if first <= at <= last]
    figures.update(page_loads_during=len(during), page_p50_ms=1000 * percentile(during, 0.5),
                   page_p95_ms=1000 * percentile(during, 0.95), page_max_ms=1000 * max(during, default=float("nan")),
                   baseline_p50_ms=1000 * statistics.median(result["baseline_pages"]),
                   baseline_p95_ms=1000 * percentile(result["baseline_pages"], 0.95), streams_seconds=last - first,
                   tokens=delta("glassbox_tokens_total"), loop_rows=delta("glassbox_loop_rows_total"))
    ok("page-load p95 under 200 ms while streams run", len(during) >= 20 and figures["page_p95_ms"] < 200,
       f"{len(during)} loads, p95 {figures['page_p95_ms']:.0f} ms")

    check_positions(ok, browsers)
    return checks, figures


def check_saved(ok, browsers: list[Browser], instance: Path, tokens_counted: float) -> None:
    """SQLite against the streams: every reply saved once, as streamed; the token counter matches."""
    import html
    with sqlite3.connect(instance / "glassbox.sqlite3") as db:
        db.row_factory = sqlite3.Row
        rows = {r["id"]: dict(r) for r in db.execute("SELECT * FROM messages WHERE role = 'assistant'")}
    chats = [b for b in browsers if b.kind == "chat"]
    problems = []
    for b in chats:
        row = rows.get(int(re.search(r"/m/(\d+)/stream", b.url).group(1)))
        streamed = "".join(html.unescape(d) for _, n, d in b.events if n == "token")
        final = [re.search(r'<span class="text">(.*?)</span>', d, re.S) for _, n, d in b.events if n == "done"]
        saved = re.sub(r"\r\n|\r", "\n", row["content"]) if row else None
        if row is None or row["status"] not in ("complete", "stopped"):
            problems.append(f"#{b.index}: {row and row['status']}")
        elif not saved.startswith(streamed):
            problems.append(f"#{b.index}: what was streamed is not the start of the saved text")
        elif b.hang_up_after is None and not (final and final[0] and html.unescape(final[0].group(1)) == saved):
            problems.append(f"#{b.index}: the final event does not show the saved text")
        elif b.hang_up_after is None and streamed and streamed != saved:
            problems.append(f"#{b.index}: saved text differs from the tokens streamed")
    ok("no reply lost: every reply saved once, complete or stopped, as streamed",
       not problems and len(rows) == len(chats), "; ".join(problems) or f"{len(rows)} replies")
    saved_tokens = sum(r["tokens"] or 0 for r in rows.values())
    ok("tokens counted = tokens saved (no generation ran twice)", saved_tokens == tokens_counted,
       f"counter {tokens_counted:.0f}, saved {saved_tokens}")


def check_positions(ok, browsers: list[Browser]) -> None:
    """Each stream's positions only go down, never below 1 and never above the number of jobs
    submitted before it; a stream told a position later hears that its job is running (or it ends)."""
    problems = []
    for b in browsers:
        names = [n for _, n, _ in b.events]
        positions = [int(re.search(r"\d+", d).group()) for _, n, d in b.events if n == "position"]
        if any(p < 1 for p in positions) or any(a <= c for a, c in zip(positions, positions[1:])):
            problems.append(f"#{b.index}: {positions}")
        if positions and positions[0] > b.index:
            problems.append(f"#{b.index} was told {positions[0]} with {b.index} jobs ahead at most")
        if "running" in names and "position" in names[names.index("running"):]:
            problems.append(f"#{b.index}: a position after running")
    ok("queue positions reported consistently", not problems,
       "; ".join(problems) or f"{sum('position' in [n for _, n, _ in b.events] for b in browsers)} streams saw "
       "positions, first ones "
       f"{[int(re.search(r'[0-9]+', d).group()) for b in browsers for _, n, d in b.events[:1] if n == 'position']}")


# -- main ------------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running Glassbox on loopback (default: start gunicorn here)")
    parser.add_argument("--instance", type=Path, help="its instance folder, to check SQLite (with --url)")
    parser.add_argument("--models", choices=["bundled", "test"], default="bundled")
    parser.add_argument("--nginx", action="store_true", help="put nginx (deploy/nginx.conf) in front, at /glassbox/")
    parser.add_argument("--chats", type=int, default=16)
    parser.add_argument("--loops", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64, help="max_new_tokens of each reply")
    parser.add_argument("--disconnect", type=float, default=0.25, help="share of browsers that hang up")
    parser.add_argument("--hang-up-within", type=float, default=2.0, help="seconds after opening their stream")
    parser.add_argument("--page-clients", type=int, default=2)
    parser.add_argument("--page-pause", type=float, default=0.05)
    parser.add_argument("--threads", type=int, default=32, help="gunicorn threads (GLASSBOX_THREADS)")
    parser.add_argument("--time-limit", type=float, default=240)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write figures and checks here")
    args = parser.parse_args()
    if args.chats + args.loops > 64 or args.time_limit > 900:
        parser.error("bounded on purpose: at most 64 jobs and 900 s")

    server, proxy, workdir = None, None, None
    if args.url:
        if urllib.parse.urlsplit(args.url).hostname not in LOOPBACK:
            parser.error("loopback only: --url must be on 127.0.0.1")
    else:
        workdir = Path(tempfile.mkdtemp(prefix="glassbox-load-"))
        env = {"GLASSBOX_THREADS": str(args.threads), "GLASSBOX_LOG_LEVEL": "info",
               "GLASSBOX_MAX_STREAMS_PER_CLIENT": "0", "GLASSBOX_MAX_JOBS_PER_CLIENT": "0"}  # all share 127.0.0.1
        if args.models == "test":
            env.update(model_env(workdir, chat_arch="tiny:0.03", loop_delay=0.05))
        server = Gunicorn(workdir / "instance", env).start(ready_timeout=300)
        args.url, args.instance = server.url, workdir / "instance"
        if args.nginx:
            proxy = Nginx(workdir / "nginx", server.port).start()
            args.url = proxy.url + "/glassbox"
    print(f"load run against {args.url} ({args.models} models): {args.chats} chats, {args.loops} loop runs, "
          f"{args.disconnect:.0%} hang up, {args.page_clients} page loaders", flush=True)
    try:
        run = Run(args)
        result = run.go()
        checks, figures = check(run, result, args.instance, server.log() if server else None)
    finally:
        if proxy:
            proxy.stop()
        if server:
            server.stop()
    for name, passed, detail in checks:
        print(f"{'PASS' if passed else 'FAIL'}  {name}" + (f"  ({detail})" if detail else ""))
    print(json.dumps(figures, indent=1, default=str))
    if args.json:
        args.json.write_text(json.dumps({"figures": figures, "checks": checks}, indent=1, default=str))
    return 0 if all(passed for _, passed, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
