"""Long whole jobs against another address's short ones (issue 52): while address A runs four maximal
activation-patching jobs, does address B still get Inside, the whole-reply lens, "who pushed this token" and an
8-step Loop-lab run in about their own time?

    .venv/bin/python -m bench.robustness.patching_flood                 # the bundled model
    .venv/bin/python -m bench.robustness.patching_flood --repeats 3 --no-doc

Real gunicorn (as `make run` starts it) on the bundled models. A (127.0.0.2) sends a message of 690
characters, then asks for the patching map of its reply's last token four times at once, each with another
corrupted message (one letter changed), so four jobs, each of a few minutes. B (127.0.0.1) asks for each of
its requests alone first, then again while A's jobs run (each request a fresh one: another token, so nothing
is answered from a kept report). Target: each of B's within 2x alone + 100 ms.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402
from bench.robustness.hostile_kit import Raw, mapping  # noqa: E402
from tests.support.servers import Gunicorn, stream_url  # noqa: E402

LONG = ("Tell me about the rivers of Europe, their sources, the seas they reach, the cities on their banks and "
        "the bridges that cross them, and say which of them carried the most trade in the middle ages, which "
        "were canalised first, which still flood each spring, and which ones the old maps drew wrong; then add "
        "what the rivers of the north have in common, why the Danube crosses so many countries, how the Rhine "
        "was made straight, what the Volga means to the people who live beside it, and what a traveller should "
        "see first on each of them in a week of spring, walking and by boat, with the towns to sleep in. Keep "
        "it short, and name a book for each river where you can, with its year and its author's name.")[:690]


def conversation(base: str, address: str, content: str, tokens: int, raw: Raw | None = None
                 ) -> tuple[Raw, str, str, int]:
    """A browser at `address` (`raw`, or a new one) with a new conversation and its finished reply -> (its client,
    conversation, message, tokens)."""
    if raw is None:
        raw = Raw(base, address)
        raw.request("GET", "/chat/")
    status, _, body = raw.form("/chat/send", {"content": content, "max_new_tokens": str(tokens), "temperature": "0"},
                               headers={"HX-Request": "true"})
    assert status == 200, body[:300]
    url = stream_url(body.decode()).removeprefix(raw.prefix)
    raw.request("GET", url, timeout=300)
    found = re.search(r"/chat/c/(\w+)/m/(\d+)/stream", url)
    assert found, url
    _, _, data = raw.request("GET", f"/chat/c/{found[1]}/m/{found[2]}/inside/999999.json", timeout=60)
    last = re.search(rb"tokens 0 to (\d+)", data)
    return raw, found[1], found[2], int(last[1]) + 1 if last else 1


class B:
    """The other address: each request fresh (another token, another reply's lens, another table), timed."""

    def __init__(self, base: str, tokens: int, replies: int) -> None:
        self.raw, self.cid, self.mid, self.tokens = conversation(base, "127.0.0.1", "What is the capital of France?",
                                                                 tokens)
        # a whole-reply lens is kept per reply: one reply per ask
        self.others = [conversation(base, "127.0.0.1", f"What is the capital of country number {n}?", tokens,
                                    self.raw) for n in range(replies)]
        self.next = {"inside": 0, "attribution": 0, "lens": 0, "loops": 0}

    def ask(self, what: str) -> float:
        n = self.next[what]
        self.next[what] += 1
        base = f"/chat/c/{self.cid}/m/{self.mid}"
        started = time.monotonic()
        if what == "loops":
            body = json.dumps({"mapping": mapping(3 + n % 20), "start": "A", "steps": 8}).encode()
            status, _, _ = self.raw.request("POST", "/api/loops/trace", body, {"Content-Type": "application/json"},
                                            timeout=900)
        else:
            path = {"inside": f"{base}/inside/{n % self.tokens}.json",
                    "attribution": f"{base}/attribution/{n % self.tokens}.json",
                    "lens": f"/chat/c/{self.others[n][1]}/m/{self.others[n][2]}/lens.json"}[what]
            status, _, _ = self.raw.request("GET", path, timeout=900)
        assert status == 200, (what, status)
        return time.monotonic() - started


def flood(base: str, tokens: int) -> tuple[threading.Event, list[threading.Thread], dict]:
    """A's four patching jobs, each asked for in a thread of its own (a 503 at the wait limit: asked again)."""
    raw, cid, mid, count = conversation(base, "127.0.0.2", LONG, tokens)
    stop = threading.Event()
    got: dict[str, Any] = {"done": 0, "other": 0, "refused": "", "statuses": []}

    def ask(n: int) -> None:
        corrupted = LONG[:40 + n] + ("x" if LONG[40 + n] != "x" else "y") + LONG[41 + n:]
        body = json.dumps({"corrupted": corrupted, "against": 32}).encode()
        while not stop.is_set():
            status, _, answer = raw.request("POST", f"/chat/c/{cid}/m/{mid}/patching/{count - 1}.json", body,
                                            {"Content-Type": "application/json"}, timeout=900)
            got["done" if status == 200 else "other"] += 1
            got["statuses"].append(status)
            if status == 200:
                return
            if status == 400:  # the alternative is the reply's own token, or too many cells: no flood to measure
                got["refused"] = answer.decode()[:300]
                return
            stop.wait(1)
    threads = [threading.Thread(target=ask, args=(n,), daemon=True) for n in range(4)]
    for thread in threads:
        thread.start()
    return stop, threads, got


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="each of B's requests, alone and under the flood")
    p.add_argument("--tokens", type=int, default=32, help="max_new_tokens of both replies")
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args(argv)
    load_before = common.load_average()
    kinds = ["inside", "attribution", "lens", "loops"]
    with tempfile.TemporaryDirectory() as tmp:
        server = Gunicorn(Path(tmp) / "instance", {"GLASSBOX_THREADS": "32", "GLASSBOX_MAX_STREAMS": "24",
                                                   "GLASSBOX_INSIDE_WAIT_SECONDS": "600"}).start(ready_timeout=300)
        try:
            b = B(server.url, args.tokens, 2 * args.repeats + 1)
            for what in kinds:
                b.ask(what)  # warm: each route's first answer
            alone = {what: [b.ask(what) for _ in range(args.repeats)] for what in kinds}
            stop, threads, got = flood(server.url, args.tokens)
            time.sleep(5)  # A's jobs queued and running
            loaded = {what: [b.ask(what) for _ in range(args.repeats)] for what in kinds}
            stop.set()
        finally:
            server.stop()
    if got["refused"]:
        print(f"A's patching requests were refused, so there was no flood: {got['refused']}", file=sys.stderr)
        return 2
    rows, ok = [], True
    for what in kinds:
        a, f = statistics.median(alone[what]), statistics.median(loaded[what])
        bound = 2 * a + 0.1
        ok = ok and f <= bound
        rows.append([what, f"{1000 * a:.0f}", f"{1000 * f:.0f}", f"{1000 * max(loaded[what]):.0f}",
                     f"{1000 * bound:.0f}", "yes" if f <= bound else "NO"])
    body = (common.table(["B's request", "alone ms (median)", "under A's flood ms (median)", "worst ms",
                          "bound ms", "within"], rows)
            + f"\n\n- real gunicorn, the bundled models; A: 4 patching jobs of its reply's last token after a "
              f"690-character message ({got['done']} finished during the run; their answers, when the server stopped: "
              f"{got['statuses']}); B: each "
              f"request {args.repeats} "
              "times alone, then as many under the flood, each a fresh one; bound = 2 x alone + 100 ms")
    common.report("Another address's short jobs beside four patching jobs", body, load_before=load_before,
                  write_doc=not args.no_doc)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
