"""A hostile-client run against real gunicorn behind real nginx, loopback only, bounded in count and
time; it stops by itself.

    .venv/bin/python -m bench.robustness.hostile                  # ~2 minutes on the tiny test models
    .venv/bin/python -m bench.robustness.hostile --attack-seconds 30 --no-report
    .venv/bin/python -m bench.robustness.hostile --each --attack-seconds 20   # issue 25's attacks one at a time
    .venv/bin/python -m bench.robustness.hostile --each --postgres            # the same, the history in PostgreSQL

All the attacks at once, each from its own loopback address (127.0.0.2, .3, ...; nginx reports it in
X-Forwarded-For, so the per-address limits see six clients): stream hogs that open streams and never
read, cookie-less floods of sends, paced replays, uploads (valid traces and oversized bodies), API
amplification (NDJSON snapshot runs of 256 loops, never read) and slowloris (headers a byte at a time)
against nginx. Meanwhile a well-behaved user on 127.0.0.1 loads pages, chats and runs the Loop lab.

Reported: the good user's page loads (p50/p95) and time to first token under attack, against the same
user unloaded (the bound: the unloaded TTFT plus one reply), the instance folder's growth per minute
under attack (and what the quotas allow), what each attack got back, and every 5xx seen (503 with a
documented busy message is the only one allowed). Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import load_average, report, table  # noqa: E402
from bench.robustness.hostile_kit import LETTERS, LIMITS, PREFIX, GoodUser, Raw, Tally, mapping, percentile  # noqa: E402
from tests.support.servers import Client, Gunicorn, Nginx, model_env, parse_metrics, stream_url  # noqa: E402

ATTACKERS = {"hogs": "127.0.0.2", "floods": "127.0.0.3", "replays": "127.0.0.4", "uploads": "127.0.0.5",
             "amplify": "127.0.0.6", "slowloris": "127.0.0.7"}


def stored_by_owner(path: Path) -> list[list]:
    """Text kept at the end, by kind of owner: browsers (one cookie each) and anonymous API runs."""
    import sqlite3
    db = sqlite3.connect(path)
    try:
        rows = db.execute(
            "SELECT CASE WHEN owner LIKE 'api:%' THEN 'anonymous API runs' ELSE 'browsers' END, COUNT(DISTINCT owner),"
            " COUNT(*), SUM(LENGTH(snapshot)), MAX(o) FROM (SELECT owner, snapshot, SUM(LENGTH(snapshot))"
            " OVER (PARTITION BY owner) AS o FROM traces) GROUP BY 1").fetchall()
        chat = db.execute("SELECT COUNT(DISTINCT c.owner), COUNT(*), SUM(LENGTH(m.content)) FROM conversations c"
                          " JOIN messages m ON m.conversation_id = c.id").fetchone()
    finally:
        db.close()
    out = [[f"traces of {kind}", owners, n, (total or 0) / 2**20, (most or 0) / 2**20]
           for kind, owners, n, total, most in rows]
    out.append(["chat messages (browsers)", chat[0], chat[1], (chat[2] or 0) / 2**20, float("nan")])
    return out




def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.name.endswith(".log"))








class Attack:
    def __init__(self, args, base: str, tally: Tally, stop: threading.Event) -> None:
        self.args, self.base, self.tally, self.stop = args, base, tally, stop
        self.held: list[socket.socket] = []
        self.held_lock = threading.Lock()
        self.counts = collections.Counter()

    def keep(self, sock: socket.socket) -> None:
        with self.held_lock:
            self.held.append(sock)
            while len(self.held) > self.args.max_held:  # bounded: the oldest goes
                self.held.pop(0).close()

    def paced(self, seconds: float) -> None:
        self.stop.wait(seconds)

    # -- the attacks -------------------------------------------------------------------------
    def hogs(self) -> None:
        """Start replies and Loop-lab runs, open their streams, never read them."""
        raw = Raw(self.base, ATTACKERS["hogs"])
        raw.request("GET", "/loops/")
        n = 0
        while not self.stop.is_set():
            n += 1
            if n % 2:
                status, _, body = raw.form("/chat/send", {"content": "Tell me about Glassbox",
                                                          "max_new_tokens": "150"}, headers={"HX-Request": "true"})
            else:
                status, _, body = raw.form("/loops/run", {"src": list(LETTERS), "dst": [d for _, d in mapping(n)],
                                                          "start": "A", "steps": "256"}, headers={"HX-Request": "true"})
            self.tally.add("hogs", status, body, "submit")
            if status == 200:
                try:
                    url = stream_url(body.decode())
                    for _ in range(3):  # the same stream three times, none read
                        self.keep(raw.hold(url[len(PREFIX):] if url.startswith(PREFIX) else url))
                        self.counts["hogs streams held"] += 1
                except (AssertionError, OSError):
                    pass
            self.paced(0.3)

    def floods(self) -> None:
        """Sends with no cookie at all (CSRF), and with a fresh cookie each time (new-session limit)."""
        while not self.stop.is_set():
            raw = Raw(self.base, ATTACKERS["floods"], keep_cookie=False)
            status, _, body = raw.form("/chat/send", {"content": "spam"})
            self.tally.add("floods", status, body, "send without cookie")
            raw = Raw(self.base, ATTACKERS["floods"])
            status, _, body = raw.request("GET", "/chat/")
            self.tally.add("floods", status, body, "page for a cookie")
            if status == 200:
                status, _, body = raw.form("/chat/send", {"content": "spam " * 20, "max_new_tokens": "64"},
                                           headers={"HX-Request": "true"})
                self.tally.add("floods", status, body, "send with a fresh cookie")
            self.counts["flood requests"] += 3
            self.paced(0.02)

    def replays(self) -> None:
        """Paced replays of a saved trace, opened again and again, read at a crawl."""
        raw = Raw(self.base, ATTACKERS["replays"])
        status, _, body = raw.request("POST", "/api/loops/trace", json.dumps(
            {"mapping": mapping(5), "start": "A", "steps": 64}).encode(), {"Content-Type": "application/json"})
        self.tally.add("replays", status, body, "api run")
        trace = json.loads(body.decode().strip().splitlines()[-1]).get("trace_id") if status == 200 else None
        if not trace:
            return
        while not self.stop.is_set():
            self.keep(raw.hold(f"/loops/traces/{trace}/replay"))
            self.counts["replays opened"] += 1
            self.paced(0.2)

    def uploads(self) -> None:
        """Valid traces uploaded over and over (quota: the oldest roll), and oversized bodies."""
        raw = Raw(self.base, ATTACKERS["uploads"])
        raw.request("GET", "/loops/")
        status, _, body = raw.request("POST", "/api/loops/trace", json.dumps(
            {"mapping": mapping(7), "start": "A", "steps": 256}).encode(), {"Content-Type": "application/json"})
        trace = json.loads(body.decode().strip().splitlines()[-1]).get("trace_id") if status == 200 else None
        status, _, file = raw.request("GET", f"/loops/traces/{trace}.json") if trace else (0, {}, b"{}")
        n = 0
        while not self.stop.is_set():
            n += 1
            big = n % 4 == 0
            content = (b"x" * (600 * 1024)) if big else file
            boundary = "glassboxhostile"
            body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"csrf_token\"\r\n\r\n{raw.csrf}\r\n"
                    f"--{boundary}\r\nContent-Disposition: form-data; name=\"trace\"; filename=\"t.json\"\r\n"
                    f"Content-Type: application/json\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
            status, _, answer = raw.request("POST", "/loops/traces/upload", body,
                                            {"Content-Type": f"multipart/form-data; boundary={boundary}"})
            self.tally.add("uploads", status, answer, "oversized upload" if big else "upload")
            self.counts["uploads " + ("oversized" if big else "valid")] += 1
            self.paced(0.1)

    def amplify(self) -> None:
        """The JSON API's biggest answer (snapshots of 256 loops, ~12 MB) asked for and never read."""
        raw = Raw(self.base, ATTACKERS["amplify"], keep_cookie=False)
        body = json.dumps({"mapping": mapping(3), "start": "A", "steps": 256}).encode()
        while not self.stop.is_set():
            self.keep(raw.hold("/api/loops/trace?stream=snapshots", "POST", body, {"Content-Type": "application/json"}))
            self.counts["amplified runs sent"] += 1
            status, _, answer = raw.request("POST", "/v1/chat/completions", json.dumps(
                {"model": "glassbox", "max_tokens": 10**6, "messages": [{"role": "user", "content": "hi" * 4000}]}
            ).encode(), {"Content-Type": "application/json"})
            self.tally.add("amplify", status, answer, "/v1 huge")
            self.paced(0.25)

    def slowloris(self) -> None:
        """Connections to nginx that send their headers a byte at a time and never finish."""
        socks = []
        while not self.stop.is_set():
            while len(socks) < self.args.slowloris:
                try:
                    s = socket.create_connection(
                        (urllib.parse.urlsplit(self.base).hostname, urllib.parse.urlsplit(self.base).port),
                        timeout=5, source_address=(ATTACKERS["slowloris"], 0))
                    s.sendall(f"GET {PREFIX}/chat/ HTTP/1.1\r\nHost: x\r\n".encode())
                    socks.append(s)
                    self.counts["slowloris connections"] += 1
                except OSError:
                    break
            for s in list(socks):
                try:
                    s.sendall(b"X-a: b\r\n")
                except OSError:
                    socks.remove(s)
            self.paced(2.0)
        for s in socks:
            s.close()

    def release(self) -> None:
        with self.held_lock:
            for s in self.held:
                s.close()
            self.held.clear()




def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attack-seconds", type=float, default=60)
    parser.add_argument("--baseline-seconds", type=float, default=15)
    parser.add_argument("--tokens", type=int, default=32, help="the good user's reply length")
    parser.add_argument("--max-held", type=int, default=120, help="never-read sockets held at once, all attacks")
    parser.add_argument("--slowloris", type=int, default=60, help="slowloris connections held")
    parser.add_argument("--no-report", action="store_true", help="print, do not append to docs/benchmarks-history.md")
    parser.add_argument("--each", action="store_true",
                        help="issue 25's attacks one at a time, through nginx and direct (hostile_each.py)")
    parser.add_argument("--only", action="append", help="with --each: the attacks whose name contains this")
    parser.add_argument("--postgres", action="store_true",
                        help="with --each: the history in a throwaway PostgreSQL cluster (GLASSBOX_DATABASE_URL)")
    args = parser.parse_args()
    if args.attack_seconds > 300 or args.max_held > 200 or args.slowloris > 150:
        parser.error("bounded on purpose: at most 300 s of attack, 200 held sockets, 150 slowloris connections")
    if args.each:
        from bench.robustness.hostile_each import main_each
        return main_each(args)
    load_before = load_average()
    workdir = Path(tempfile.mkdtemp(prefix="glassbox-hostile-"))
    env = {**model_env(workdir, chat_arch="tiny:0.03", loop_delay=0.05), **LIMITS, "GLASSBOX_LOG_LEVEL": "info"}
    server = Gunicorn(workdir / "instance", env).start(ready_timeout=300)
    proxy = Nginx(workdir / "nginx", server.port).start()
    base = proxy.url + PREFIX
    tally, stop = Tally(), threading.Event()
    attack = Attack(args, base, tally, stop)
    def give_up() -> None:
        print("hostile: over its time bound, stopping", flush=True)
        stop.set()
        proxy.stop()
        server.stop()
        os._exit(2)

    hard_stop = threading.Timer(args.baseline_seconds + args.attack_seconds + 120, give_up)
    hard_stop.daemon = True
    hard_stop.start()  # whatever hangs, the run ends by itself
    try:
        # -- unloaded ---------------------------------------------------------------------------
        calm = GoodUser(base, tally)
        calm.session(time.monotonic() + args.baseline_seconds, args.tokens)
        # -- under attack -----------------------------------------------------------------------
        size_before, t_before = folder_bytes(workdir / "instance"), time.monotonic()
        threads = [threading.Thread(target=getattr(attack, name), daemon=True, name=name) for name in ATTACKERS]
        for thread in threads:
            thread.start()
        time.sleep(3)  # the attacks are up
        good = GoodUser(base, tally)
        good.session(time.monotonic() + args.attack_seconds - 3, args.tokens)
        size_after, t_after = folder_bytes(workdir / "instance"), time.monotonic()
        metrics = parse_metrics(Client(server.url).get("/metrics").text)
        stop.set()
        for thread in threads:
            thread.join(20)
        attack.release()
        time.sleep(2)
        after = Client(base)
        after.get("/")  # the server still answers once the attackers left
        recovered = after.get("/readyz").status
    finally:
        stop.set()
        attack.release()
        proxy.stop()
        server.stop()
    log = server.log()
    stored = stored_by_owner(workdir / "instance" / "glassbox.sqlite3")
    tracebacks = log.count("Traceback")
    growth_per_min = (size_after - size_before) / max(1e-9, (t_after - t_before) / 60)
    # storage is per owner: the cookie-keeping attackers (hogs, replays, uploads) and the API's throwaway owners
    bound_note = f"{int(LIMITS['GLASSBOX_MAX_STORED_BYTES']) // 2**20} MiB of text per browser"
    ttft_bound = statistics.median(calm.ttft) + statistics.median(calm.reply_s) if calm.ttft else float("nan")
    ttft_p95 = percentile(good.ttft, 0.95)
    checks = [
        ("no 5xx except documented busy answers", not tally.bad,
         f"{len(tally.bad)}: " + "; ".join(f"{n}× {b}" for b, n in collections.Counter(tally.bad).most_common(4))),
        ("no traceback in the server log", tracebacks == 0, f"{tracebacks} tracebacks"),
        ("good user got replies under attack", len(good.ttft) >= 2, f"{len(good.ttft)} replies"),
        ("good user's p95 TTFT within unloaded TTFT + one reply", ttft_p95 <= ttft_bound,
         f"{ttft_p95:.2f} s vs {ttft_bound:.2f} s"),
        ("server ready after the attack", recovered == 200, str(recovered)),
    ]
    rows = [["page load p50 (s)", statistics.median(calm.pages),
             statistics.median(good.pages) if good.pages else float("nan")],
            ["page load p95 (s)", percentile(calm.pages, 0.95), percentile(good.pages, 0.95)],
            ["page loads", len(calm.pages), len(good.pages)],
            ["TTFT median (s)", statistics.median(calm.ttft) if calm.ttft else float("nan"),
             statistics.median(good.ttft) if good.ttft else float("nan")],
            ["TTFT p95 (s)", percentile(calm.ttft, 0.95), ttft_p95],
            [f"reply of {args.tokens} tokens, median (s)",
             statistics.median(calm.reply_s) if calm.reply_s else float("nan"),
             statistics.median(good.reply_s) if good.reply_s else float("nan")],
            ["streams refused (503) and retried / given up", f"{calm.retries} / {calm.refused}",
             f"{good.retries} / {good.refused}"],
            ["Loop-lab run of 12 steps, median (s)", statistics.median(calm.loop_s) if calm.loop_s else float("nan"),
             statistics.median(good.loop_s) if good.loop_s else float("nan")]]
    attack_rows = [[who, ", ".join(f"{code}: {n}" for code, n in sorted(codes.items()))]
                   for who, codes in sorted(tally.codes.items())]
    body = (f"Tiny test models (30 ms a token, 50 ms a loop) behind nginx (deploy/nginx.conf) at {PREFIX}/, "
            f"limits {', '.join(f'{k}={v}' for k, v in LIMITS.items())}; {args.attack_seconds:.0f} s of attack "
            f"(hogs, floods, paced replays, uploads, API amplification, {args.slowloris} slowloris connections), "
            f"each from its own loopback address, while one good user on 127.0.0.1 loads pages, chats and runs "
            f"the Loop lab. Unloaded: the same user for {args.baseline_seconds:.0f} s before.\n\n"
            + table(["good user", "unloaded", "under attack"], rows) + "\n\n"
            + table(["who", "statuses"], attack_rows) + "\n\n"
            + table(["figure", "value"], [
                ["instance folder growth under attack (MiB/min)", growth_per_min / 2**20],
                ["instance folder before / after (MiB)", f"{size_before / 2**20:.2f} / {size_after / 2**20:.2f}"],
                ["storage quota", bound_note],
                ["open streams at the end of the attack", metrics.get("glassbox_open_streams", float("nan"))],
                *[[k, v] for k, v in sorted(attack.counts.items())]]) + "\n\n"
            + table(["kept at the end", "owners", "rows", "MiB", "most one owner keeps (MiB)"], stored) + "\n\n"
            + table(["check", "result", "detail"], [[n, "PASS" if p else "FAIL", d] for n, p, d in checks]))
    report("Hostile clients (bench.robustness.hostile)", body, load_before=load_before, write_doc=not args.no_report)
    return 0 if all(p for _, p, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
