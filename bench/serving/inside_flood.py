"""A cached Inside JSON flood (issue 33, item 3): a good user's decode tokens/s while N threads from another
loopback address fetch one Inside report's JSON, already worked out and kept, as fast as they can, straight
to gunicorn (gunicorn.conf.py, the bundled models).

    .venv/bin/python -m bench.serving.inside --flood 12                    # this checkout only
    .venv/bin/python -m bench.serving.inside --flood 12 --baseline main    # and a revision, before/after
    .venv/bin/python -m bench.serving.inside --flood 4 --addresses 4 --pace 9 --nginx --baseline main

Servers, one after another on the same machine: the --baseline revision (a temporary git worktree) if
given; this checkout with GLASSBOX_HEAVY_READ_BYTES_PER_SECOND=0 (the JSON kept as bytes, no budget); this
checkout as configured by default (kept as bytes, and the per-address budget). On each: the good user
(127.0.0.1, straight to gunicorn) asks for replies alone, then with the flood running (from 127.0.0.2 on, one
address per thread up to --addresses; through nginx with --nginx, which reports each address); its decode
rate is (tokens - 1) over the time from its first token to its last, summed over its replies. The flood asks without
Accept-Encoding (plain bytes: the dearest to send) unless --gzip.
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench import common
from tests.support.servers import Client, Gunicorn, Nginx, stream_url

QUESTION = "Tell me about Glassbox, then what is the capital of France and the symbol of gold?"


def good_replies(server: Gunicorn, replies: int, tokens: int) -> dict:
    """The good user's replies -> decode tokens/s (summed) and first-token times."""
    client = Client(server.url)
    client.get("/chat/")
    decoded, seconds, firsts = 0, 0.0, []
    for n in range(replies):
        started = time.monotonic()
        sent = client.post("/chat/send", {"content": QUESTION, "max_new_tokens": str(tokens), "temperature": "1.0",
                                          "seed": str(n)}, htmx=True)
        assert sent.status == 200, sent.text[:300]
        stream = client.open_stream(stream_url(sent.text), timeout=120)
        times = []
        for event in stream.events():
            if event.name == "token":
                times.append(event.at)
            if event.name == "done":
                break
        stream.close()
        if times:
            firsts.append(times[0] - started)
        if len(times) > 1:
            decoded += len(times) - 1
            seconds += times[-1] - times[0]
    return {"rate": decoded / seconds if seconds else float("nan"), "ttft": common.median(firsts) if firsts else 0,
            "tokens": decoded + len(firsts)}


def cached_inside(server: Gunicorn) -> str:
    """A reply worked out and its last token's Inside report kept -> the share link's JSON path (no cookie)."""
    client = Client(server.url)
    client.get("/chat/")
    sent = client.post("/chat/send", {"content": QUESTION, "max_new_tokens": "60", "temperature": "1.0",
                                      "seed": "99"}, htmx=True)
    url = stream_url(sent.text)
    count = sum(1 for e in client.open_stream(url, timeout=120).events() if e.name == "token")
    conversation = re.search(r'name="conversation_id" value="([0-9a-f]+)"', sent.text).group(1)
    message = re.search(r"/m/(\d+)/stream", url).group(1)
    client.post(f"/chat/c/{conversation}/share", {})
    token = re.search(r"/chat/shared/([\w-]+)", client.get(f"/chat/c/{conversation}").text).group(1)
    path = f"/chat/shared/{token}/m/{message}/inside/{count - 1}.json"
    answer = client.get(path, timeout=300)  # worked out now, kept from here on
    assert answer.status == 200, answer.text[:300]
    return path


def flood(port: int, path: str, threads: int, stop: threading.Event, gzip: bool, counts: dict,
          addresses: list[str], pace: float = 0.0) -> list:
    """`threads` threads, spread over `addresses`, each asking for `path` as fast as it can, or `pace` times a
    second (0: as fast)."""
    def one(address: str) -> None:
        conn = None
        next_at = time.monotonic()
        while not stop.is_set():
            if pace:
                next_at += 1 / pace
                stop.wait(max(0.0, next_at - time.monotonic()))
            try:
                conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(address, 0))
                conn.request("GET", path, headers={"Accept-Encoding": "gzip"} if gzip else {})
                response = conn.getresponse()
                body = response.read()
                with lock:
                    counts[response.status] = counts.get(response.status, 0) + 1
                    counts["bytes"] = counts.get("bytes", 0) + len(body)
                if response.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException):
                if conn is not None:
                    conn.close()
                conn = None
                with lock:
                    counts["errors"] = counts.get("errors", 0) + 1
                stop.wait(0.05)
        if conn is not None:
            conn.close()

    lock = threading.Lock()
    workers = [threading.Thread(target=one, args=(addresses[n % len(addresses)],), daemon=True)
               for n in range(threads)]
    for worker in workers:
        worker.start()
    return workers


def phases(server: Gunicorn, path: str, args, via: tuple[int, str]) -> tuple[dict, dict, dict, float]:
    """The good user alone and flooded, alternating for --rounds -> (alone, flooded, flood counts, flooded s)."""
    alone, flooded, counts, elapsed = [], [], {}, 0.0
    for _ in range(args.rounds):
        alone.append(good_replies(server, args.replies, args.tokens))
        stop = threading.Event()
        port, prefix = via
        addresses = [f"127.0.0.{2 + n}" for n in range(args.addresses)]
        workers = flood(port, prefix + path, args.flood, stop, args.gzip, counts, addresses, args.pace)
        time.sleep(1.0)  # the flood is up
        started = time.monotonic()
        flooded.append(good_replies(server, args.replies, args.tokens))
        elapsed += time.monotonic() - started
        stop.set()
        for worker in workers:
            worker.join(30)
    return joined(alone), joined(flooded), counts, elapsed


def cpu_seconds(server: Gunicorn) -> float:
    """User + system CPU time of gunicorn's processes (the master and its worker) so far."""
    assert server.proc is not None
    pids = [server.proc.pid] + [int(p) for task in Path(f"/proc/{server.proc.pid}/task").iterdir()
                                for p in (task / "children").read_text().split()]
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def cost_per_answer(server: Gunicorn, path: str, args, via: tuple[int, str], seconds: float = 5.0) -> float:
    """The server's CPU milliseconds per flood request, the flood alone for `seconds` (the box's other load
    changes the good user's rate, not this)."""
    stop, counts = threading.Event(), {}
    addresses = [f"127.0.0.{2 + n}" for n in range(args.addresses)]
    before = cpu_seconds(server)
    workers = flood(via[0], via[1] + path, args.flood, stop, args.gzip, counts, addresses, args.pace)
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join(30)
    answered = sum(n for status, n in counts.items() if isinstance(status, int))
    return (cpu_seconds(server) - before) * 1000 / max(1, answered)


def joined(runs: list[dict]) -> dict:
    return {"rate": common.median([r["rate"] for r in runs]), "ttft": common.median([r["ttft"] for r in runs])}


def measure(name: str, server: Gunicorn, args, via: tuple[int, str], healthz: bool = False) -> list[list]:
    path = cached_inside(server)
    size = len(Client(server.url).get(path).text.encode())
    good_replies(server, 1, args.tokens)  # warm
    rows = []
    for what, target in [("cached Inside JSON", path)] + ([("/healthz (the floor)", "/healthz")] if healthz else []):
        alone, loaded, counts, elapsed = phases(server, target, args, via)
        cost = cost_per_answer(server, target, args, via)
        print(name, what, alone, loaded, counts, cost, flush=True)
        served = counts.get(200, 0) + counts.get(304, 0)
        rows.append([name, what, size / 1024 if target == path else "", alone["rate"], loaded["rate"],
                     loaded["rate"] / alone["rate"], alone["ttft"] * 1000, loaded["ttft"] * 1000, served / elapsed,
                     counts.get(429, 0) / elapsed, counts.get("bytes", 0) / elapsed / 2**20, cost])
    return rows


def main(args) -> None:
    load_before = common.load_average()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        servers: list[tuple[str, dict, Path]] = []
        old = tmp_path / "baseline-tree"
        if args.baseline:
            subprocess.run(["git", "worktree", "add", "--detach", str(old), args.baseline], cwd=common.ROOT,
                           check=True, capture_output=True)
            servers.append((f"before: revision {args.baseline}", {}, old))
        servers.append(("after: kept as bytes, no budget", {"GLASSBOX_HEAVY_READ_BYTES_PER_SECOND": "0"}, common.ROOT))
        servers.append(("after: kept as bytes, budget (default)", {}, common.ROOT))
        try:
            for n, (name, env, root) in enumerate(servers):
                server = Gunicorn(tmp_path / f"server{n}", {"GLASSBOX_LOG_LEVEL": "warning", **env}, root=root)
                server.start(ready_timeout=600)
                proxy = Nginx(tmp_path / f"nginx{n}", server.port).start() if args.nginx else None
                try:
                    via = (proxy.port, "/glassbox") if proxy else (server.port, "")
                    rows += measure(name, server, args, via, healthz=n == len(servers) - 1)
                finally:
                    if proxy:
                        proxy.stop()
                    server.stop()
        finally:
            if args.baseline:
                subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=common.ROOT,
                               capture_output=True)
    pace = f"each {args.pace:g} requests a second" if args.pace else "as fast as they can"
    way = "through nginx (deploy/nginx.conf)" if args.nginx else "gunicorn straight"
    body = (common.table(["server", "flood of", "JSON KiB", "good user alone tok/s",
                          f"with {args.flood} flooding tok/s", "ratio", "first token alone ms",
                          "first token flooded ms", "flood answers/s (200/304)", "flood refused/s (429)",
                          "flood MiB/s", "server CPU ms per flood request"], rows)
            + f"\n\n- bundled chat model, the flood {way} (gunicorn.conf.py); the good user (straight to gunicorn): "
              f"{args.rounds} rounds of {args.replies} replies of up to {args.tokens} tokens alone, then as many "
              f"flooded (medians of the rounds), from 127.0.0.1; the flood: {args.flood} threads on "
              f"{args.addresses} addresses from 127.0.0.2, {pace}, kept-alive connections, one cached report's "
              f"JSON through its share link, {'gzip' if args.gzip else 'no Accept-Encoding'}; server CPU per flood "
              f"request: gunicorn's processes' CPU time over 5 s of the flood alone, over the requests answered "
              f"(any status)")
    title = f"Cached Inside JSON flood, {args.flood} threads{' through nginx' if args.nginx else ''}"
    common.report(title, body, load_before=load_before, write_doc=not args.no_doc)
