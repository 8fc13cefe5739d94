"""bench.robustness.hostile --each: the attacks of issue 25 (hostile_attacks.py) one at a time, through nginx and
straight to gunicorn.

    .venv/bin/python -m bench.robustness.hostile --each                       # ~8 minutes on the tiny test models
    .venv/bin/python -m bench.robustness.hostile --each --attack-seconds 10 --no-report

For each way in (nginx at /glassbox/, as deploy/nginx.conf is deployed; gunicorn's own port), a good
user on 127.0.0.1 first runs alone, then beside each attack in turn. Reported per attack: the good user's
page p95 and first-token p95, the 5xx seen (and how many were 500) by anyone; checked: no 500 anywhere, and
through nginx a page p95 under 200 ms and a first-token p95 under twice the unloaded one.
"""

from __future__ import annotations

import collections
import http.client
import multiprocessing
import threading
import time
from collections.abc import Callable

from bench.robustness.hostile_attacks import ATTACKS, Attacks
from bench.robustness.hostile_kit import LIMITS, PREFIX, GoodUser, Tally, percentile
from tests.support.servers import Client, parse_metrics

PAGE_P95_BOUND = 0.200  # seconds, through nginx
TTFT_FACTOR = 2.0       # first-token p95 under attack, at most this times the unloaded p95


class PatientUser(GoodUser):
    """The good user, who notes a page or a stream that never answers (a timeout, a reset) as a failure
    instead of stopping the run, and waits at most PAGE_TIMEOUT for a page."""

    PAGE_TIMEOUT = 10.0

    def __init__(self, base: str, tally: Tally) -> None:
        super().__init__(base, tally)
        self.failed = 0

    def _guarded(self, step: Callable[[], None]) -> None:
        try:
            step()
        except (OSError, http.client.HTTPException) as error:
            self.failed += 1
            self.tally.add("good user", 0, type(error).__name__, "no answer")
            time.sleep(0.5)

    def page(self, path: str) -> None:
        def load() -> None:
            started = time.monotonic()
            reply = self.client.get(path, timeout=self.PAGE_TIMEOUT)
            self.tally.add("good user", reply.status, reply.text, path)
            if reply.status == 200:
                self.pages.append(time.monotonic() - started)
        self._guarded(load)

    def chat(self, tokens: int) -> None:
        self._guarded(lambda: GoodUser.chat(self, tokens))

    def loops(self) -> None:
        self._guarded(lambda: GoodUser.loops(self))

    def session(self, until: float, tokens: int) -> None:
        self.until = until + 20
        while time.monotonic() < until:
            for step in (lambda: self.page("/"), lambda: self.page("/chat/"), lambda: self.page("/loops/"),
                         lambda: self.chat(tokens), lambda: self.page("/chat/"), self.loops):
                if time.monotonic() >= until and self.failed:
                    return  # a starved user does not run on past the attack
                step()


def wait_idle(server_url: str, timeout: float = 30.0) -> None:
    """Until the last attack's streams and jobs are gone (bounded), so attacks do not add up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            metrics = parse_metrics(Client(server_url).get("/metrics").text)
        except OSError:
            metrics = {}
        if not metrics.get("glassbox_open_streams") and not metrics.get("glassbox_queue_length"):
            return
        time.sleep(0.5)


def run_attack(base: str, server_url: str, name: str, seconds: float, tokens: int) -> dict:
    """One attack for `seconds` while the good user works. The attackers run in a process of their own, as
    they would on other machines: in this one they would take the measuring client's GIL, and the good
    user's times would count the attackers' own Python work (building and sending 200 KB forms) too."""
    method, threads = ATTACKS[name]
    wait_idle(server_url)
    spawn = multiprocessing.get_context("spawn")
    ready, stop, results = spawn.Event(), spawn.Event(), spawn.Queue()
    attackers = spawn.Process(target=attack_process, args=(base, method, threads, ready, stop, results), daemon=True)
    attackers.start()
    if not ready.wait(60):
        raise SystemExit(f"the attackers of {name!r} did not start")
    time.sleep(2)  # the attack is up
    tally = Tally()
    good = PatientUser(base, tally)
    good.session(time.monotonic() + seconds, tokens)
    stop.set()
    codes, bad, counts = results.get(timeout=90)
    attackers.join(30)
    for who, statuses in codes.items():
        tally.codes[who].update(statuses)
    tally.bad.extend(bad)
    return summary(good, tally, collections.Counter(counts))


def attack_process(base: str, method: str, threads: int, ready, stop, results) -> None:
    """The attackers' process: `threads` threads run the attack until `stop`; their tallies go back on `results`."""
    tally, until = Tally(), threading.Event()
    attacks = Attacks(base, tally, until)
    workers = [threading.Thread(target=getattr(attacks, method), args=(n,), daemon=True) for n in range(threads)]
    for worker in workers:
        worker.start()
    ready.set()
    stop.wait()
    until.set()
    for worker in workers:
        worker.join(30)
    results.put(({who: dict(c) for who, c in tally.codes.items()}, list(tally.bad), dict(attacks.counts)))


def summary(good: PatientUser, tally: Tally, counts: collections.Counter | None = None) -> dict:
    statuses: collections.Counter = collections.Counter()
    for codes in tally.codes.values():
        statuses.update(codes)
    return {"page_p95": percentile(good.pages, 0.95), "pages": len(good.pages),
            "ttft_p95": percentile(good.ttft, 0.95), "replies": len(good.ttft),
            "good_refused": f"{good.retries} / {good.refused}", "good_failed": good.failed,
            "good_codes": dict(tally.codes.get("good user", {})),
            "5xx": sum(n for code, n in statuses.items() if code >= 500),
            "500": statuses.get(500, 0), "bad": list(tally.bad),
            "attacker_codes": {who: dict(c) for who, c in tally.codes.items() if who != "good user"},
            "counts": dict(counts or {})}


def baseline(base: str, seconds: float, tokens: int) -> dict:
    tally = Tally()
    good = PatientUser(base, tally)
    good.session(time.monotonic() + seconds, tokens)
    return summary(good, tally)


def fmt_ms(seconds: float) -> str:
    return "n/a" if seconds != seconds else f"{seconds * 1000:.0f}"


def main_each(args) -> int:
    """Both ways in, each attack alone; one report section. -> exit status (1: a check failed)."""
    import os
    import tempfile
    from pathlib import Path

    from bench.common import load_average, report, table
    from tests.support.servers import Gunicorn, Nginx, model_env

    load_before = load_average()
    workdir = Path(tempfile.mkdtemp(prefix="glassbox-hostile-each-"))
    env = {**model_env(workdir, chat_arch="tiny:0.03", loop_delay=0.05), **LIMITS, "GLASSBOX_LOG_LEVEL": "info"}
    cluster = None
    if args.postgres:  # the history in a throwaway PostgreSQL cluster, fsync on as deployed
        from tests.support.postgres import Cluster, server_binaries
        binaries = server_binaries()
        if binaries is None:
            raise SystemExit("--postgres: PostgreSQL is not installed (make system-packages-test installs it)")
        cluster = Cluster(binaries, fsync=True).start()
        env["GLASSBOX_DATABASE_URL"] = cluster.new_database()
    server = Gunicorn(workdir / "instance", env).start(ready_timeout=300)
    proxy = Nginx(workdir / "nginx", server.port).start()
    names = [n for n in ATTACKS if not args.only or any(o in n for o in args.only)]
    bound = 2 * (args.baseline_seconds + len(names) * (args.attack_seconds + 60)) + 120

    def give_up() -> None:
        print("hostile --each: over its time bound, stopping", flush=True)
        proxy.stop()
        server.stop()
        os._exit(2)

    hard_stop = threading.Timer(bound, give_up)
    hard_stop.daemon = True
    hard_stop.start()
    results: dict[tuple[str, str], dict] = {}
    try:
        for way, base in (("nginx", proxy.url + PREFIX), ("direct", server.url)):
            wait_idle(server.url)
            results[(way, "unloaded")] = baseline(base, args.baseline_seconds, args.tokens)
            for name in names:
                print(f"hostile --each: {way}: {name}", flush=True)
                results[(way, name)] = run_attack(base, server.url, name, args.attack_seconds, args.tokens)
        recovered = Client(server.url).get("/readyz").status
    finally:
        proxy.stop()
        server.stop()
        if cluster is not None:
            cluster.remove()
    hard_stop.cancel()
    tracebacks = server.log().count("Traceback")
    rows, checks = [], []
    for (way, name), r in results.items():
        unloaded = results[(way, "unloaded")]
        rows.append([way, name, fmt_ms(r["page_p95"]), r["pages"], fmt_ms(r["ttft_p95"]), r["replies"],
                     r["good_refused"], r["good_failed"], r["5xx"], r["500"]])
        if name == "unloaded":
            continue
        checks.append((f"{way}, {name}: no 500", r["500"] == 0, f"{r['500']} of {r['5xx']} 5xx"))
        checks.append((f"{way}, {name}: the good user always got an answer", r["good_failed"] == 0,
                       f"{r['good_failed']} requests unanswered (timeout or reset)"))
        if way == "nginx":
            checks.append((f"nginx, {name}: page p95 < {PAGE_P95_BOUND * 1000:.0f} ms",
                           r["page_p95"] < PAGE_P95_BOUND, f"{fmt_ms(r['page_p95'])} ms"))
            limit = TTFT_FACTOR * unloaded["ttft_p95"]
            checks.append((f"nginx, {name}: first-token p95 < {TTFT_FACTOR:g}x unloaded",
                           r["ttft_p95"] < limit, f"{fmt_ms(r['ttft_p95'])} ms vs {fmt_ms(limit)} ms"))
    checks.append(("no traceback in the server log", tracebacks == 0, f"{tracebacks} tracebacks"))
    checks.append(("server ready after the attacks", recovered == 200, str(recovered)))
    statuses = [[way, name, who, ", ".join(f"{c}: {n}" for c, n in sorted(codes.items()))]
                for (way, name), r in results.items() for who, codes in sorted(
                    {**r["attacker_codes"], "good user": r["good_codes"]}.items())]
    undocumented = [[way, name, "; ".join(f"{n}x {b}" for b, n in collections.Counter(r["bad"]).most_common(3))]
                    for (way, name), r in results.items() if r["bad"]]
    limits = ", ".join(f"{k}={v}" for k, v in LIMITS.items())
    database = "PostgreSQL 15 (a throwaway cluster, fsync on)" if args.postgres else "SQLite"
    body = (f"Tiny test models (30 ms a token, 50 ms a loop), history in {database}, limits {limits}. "
            f"Each attack alone for {args.attack_seconds:.0f} s (after 2 s to get going) while one good user on "
            f"127.0.0.1 loads pages (/, /chat/, /loops/), chats ({args.tokens}-token replies) and runs the Loop lab; "
            f"through nginx (deploy/nginx.conf at {PREFIX}/, gunicorn on its Unix socket) and straight to gunicorn's "
            f"TCP port. Unloaded: the same user alone for {args.baseline_seconds:.0f} s. 5xx and 500 count every "
            f"answer anyone got during the attack (503 busy answers included in 5xx).\n\n"
            + table(["way in", "attack", "page p95 (ms)", "pages", "first token p95 (ms)", "replies",
                     "good user's streams refused: retried / given up", "good user: no answer", "5xx", "500"],
                    rows) + "\n\n"
            + table(["way in", "attack", "who", "statuses"], statuses) + "\n\n"
            + (table(["way in", "attack", "undocumented 5xx"], undocumented) + "\n\n" if undocumented else "")
            + table(["check", "result", "detail"], [[n, "PASS" if p else "FAIL", d] for n, p, d in checks]))
    report("Hostile clients, one attack at a time (bench.robustness.hostile --each"
           + (" --postgres)" if args.postgres else ")"), body, load_before=load_before,
           write_doc=not args.no_report)
    return 0 if all(p for _, p, _ in checks) else 1
