"""Whole jobs against a good user's reply: does a flood of Inside reports or Loop-lab runs from four
addresses leave a chatting colleague at least half their decode rate, and their first token in time?

    .venv/bin/python -m bench.robustness.fairness                       # the bundled model, then a 26M one
    .venv/bin/python -m bench.robustness.fairness --models bundled --seconds 10 --no-doc

Real gunicorn (as `make run` starts it), one per model and GLASSBOX_BULK_SHARE value, side by side in one
run. A good user on 127.0.0.1 sends one chat message at a time and reads its stream to the end: first
token (from the send), and decode rate (tokens after the first over the time from first to last, summed
over its replies). First alone, then under each flood, each from four loopback addresses (127.0.0.2-5),
three requests at a time each, straight to gunicorn (the connection's address is the client's), or with
--nginx through nginx as deployed (its per-address request limit answers a flood's excess itself):

- inside: cold "Inside this token" JSON, each address on its own replies' tokens in turn (more reports
  than GLASSBOX_INSIDE_CACHE_ENTRIES keeps, so most are worked out again);
- loops: cookie-less /api/loops/trace runs of 256 loops, each read to its end.

Targets (issue 33): decode >= 0.5x unloaded; first-token p95 <= 2x unloaded + 50 ms; the flood's own
requests still complete (its count is shown). GLASSBOX_BULK_SHARE=1 lets whole jobs take the worker as
they did before the share (a reply stepped once per 50 ms slice, or per job).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402
from bench.robustness.hostile_kit import Raw, mapping, percentile  # noqa: E402
from tests.support.servers import Client, Gunicorn, Nginx, stream_url  # noqa: E402

ADDRESSES = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
QUESTION = "What is the capital of France?"


def random_26m(folder: Path) -> dict:
    """A GPT-2-BPE model of about 26M parameters, random weights, saved as Glassbox loads a checkpoint."""
    import torch
    from safetensors.torch import save_file

    from webapp.chat.model.gpt import GPT, GPTConfig
    folder.mkdir(parents=True, exist_ok=True)
    config = {"n_layer": 4, "n_head": 6, "n_embd": 384, "block_size": 1024, "vocab_size": 50304}
    torch.manual_seed(0)
    model = GPT(GPTConfig(**config))
    path = folder / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}, str(path))
    (folder / "config.json").write_text(json.dumps({**config, "tokenizer": "gpt2"}))
    return {"GLASSBOX_CHAT_CHECKPOINT": str(path)}


class Good:
    """The colleague on 127.0.0.1: one reply at a time, read to its end."""

    def __init__(self, base: str, tokens: int) -> None:
        self.client, self.tokens = Client(base), tokens
        self.client.get("/chat/")  # its cookie and CSRF token, as a browser has them
        self.ttft: list[float] = []
        self.decoded = 0  # tokens after each reply's first
        self.decode_s = 0.0  # from each reply's first token to its last
        self.refused = 0

    def reply(self) -> None:
        started = time.monotonic()
        sent = self.client.post("/chat/send", {"content": QUESTION, "max_new_tokens": str(self.tokens)}, htmx=True)
        if sent.status != 200:
            self.refused += 1
            time.sleep(0.2)
            return
        stream = self.client.open_stream(stream_url(sent.text), timeout=120)
        stamps = []
        try:
            for event in stream.events():
                if event.name == "token":
                    stamps.append(event.at)
                if event.name == "done":
                    break
        finally:
            stream.close()
        if stamps:
            self.ttft.append(stamps[0] - started)
            self.decoded += len(stamps) - 1
            self.decode_s += stamps[-1] - stamps[0]

    def run(self, seconds: float) -> dict:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.reply()
        return {"replies": len(self.ttft), "p95": percentile(self.ttft, 0.95), "p50": percentile(self.ttft, 0.5),
                "rate": self.decoded / self.decode_s if self.decode_s else float("nan"), "refused": self.refused}


def inside_targets(base: str, address: str, replies: int, tokens: int) -> tuple[Raw, list[str]]:
    """An attacker's own conversation of `replies` replies -> (its client, the Inside JSON of every token)."""
    raw = Raw(base, address)
    raw.request("GET", "/chat/")
    urls: list[str] = []
    for n in range(replies):
        status, _, body = raw.form("/chat/send", {"content": f"{QUESTION} ({n})", "max_new_tokens": str(tokens)},
                                   headers={"HX-Request": "true"})
        assert status == 200, body[:300]
        url = stream_url(body.decode()).removeprefix(raw.prefix)  # Raw adds the prefix (nginx's /glassbox)
        raw.request("GET", url, timeout=120)  # the whole stream: the reply is finished
        found = re.search(r"/chat/c/(\w+)/m/(\d+)/stream", url)
        assert found, url
        urls += [f"/chat/c/{found[1]}/m/{found[2]}/inside/{i}.json" for i in range(_tokens_of(raw, *found.groups()))]
    return raw, urls


def _tokens_of(raw: Raw, cid: str, mid: str) -> int:
    """The reply's token count, from the Inside JSON's own message for an index past the end."""
    _, _, data = raw.request("GET", f"/chat/c/{cid}/m/{mid}/inside/999999.json", timeout=60)
    found = re.search(rb"tokens 0 to (\d+)", data)
    return int(found[1]) + 1 if found else 1


class Flood:
    """Four addresses, three requests at a time each, until stopped; counts what each got."""

    def __init__(self, kind: str, base: str, targets: dict[str, tuple[Raw, list[str]]]) -> None:
        self.kind, self.base, self.targets = kind, base, targets
        self.stop = threading.Event()
        self.done = self.refused = self.failed = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._attack, args=(address, n), daemon=True)
                        for address in ADDRESSES for n in range(3)]

    def _attack(self, address: str, n: int) -> None:
        rng = random.Random(f"{address}{n}")
        while not self.stop.is_set():
            if self.kind == "inside":
                raw, urls = self.targets[address]
                status, _, _ = raw.request("GET", urls[rng.randrange(len(urls))], timeout=300)
            else:
                raw = Raw(self.base, address, keep_cookie=False)
                body = json.dumps({"mapping": mapping(rng.randrange(1, 26)), "start": "A", "steps": 256}).encode()
                status, _, _ = raw.request("POST", "/api/loops/trace", body, {"Content-Type": "application/json"},
                                           timeout=300)
            with self.lock:
                if status == 200:
                    self.done += 1
                elif status in (429, 503):
                    self.refused += 1
                else:
                    self.failed += 1
            if status in (429, 503):
                self.stop.wait(0.05)  # refused at once: ask again a moment later, as a script would

    def __enter__(self) -> Flood:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(330)


def measure(name: str, env: dict, share: str, args, folder: Path) -> list[list]:
    server = Gunicorn(folder / f"{name}-{share}", {**env, "GLASSBOX_BULK_SHARE": share, "GLASSBOX_THREADS": "32",
                                                   "GLASSBOX_MAX_STREAMS": "48"}).start(ready_timeout=300)
    proxy = Nginx(folder / f"nginx-{name}-{share}", server.port).start() if args.nginx else None
    base = proxy.url + "/glassbox" if proxy else server.url
    rows = []
    try:
        good = Good(base, args.tokens)
        good.reply()  # warm: the first reply's pages and kernels
        alone = Good(base, args.tokens).run(args.seconds)
        targets = {a: inside_targets(base, a, args.replies, args.tokens) for a in ADDRESSES}
        rows.append(_row(name, share, "none", alone, alone, None))
        for kind in args.floods.split(","):
            with Flood(kind, base, targets) as flood:
                loaded = Good(base, args.tokens).run(args.seconds)
            rows.append(_row(name, share, kind, loaded, alone, flood))
    finally:
        if proxy:
            proxy.stop()
        server.stop()
    return rows


def _row(name: str, share: str, kind: str, got: dict, alone: dict, flood: Flood | None) -> list:
    ratio = got["rate"] / alone["rate"]
    bound = 2 * alone["p95"] + 0.05
    ok = ratio >= 0.5 and got["p95"] <= bound
    done = f"{flood.done} done, {flood.refused} refused, {flood.failed} failed" if flood else "-"
    return [name, share, kind, got["replies"], f"{got['rate']:.1f}", f"{ratio:.2f}x",
            f"{1000 * got['p50']:.0f}", f"{1000 * got['p95']:.0f}", f"{1000 * bound:.0f}",
            "yes" if ok else "NO", done]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="bundled,26m", help="bundled, 26m, or both (comma-separated)")
    p.add_argument("--shares", default="1,0.4", help="GLASSBOX_BULK_SHARE values, side by side")
    p.add_argument("--seconds", type=float, default=20.0, help="the good user's time in each case")
    p.add_argument("--tokens", type=int, default=64, help="max_new_tokens of every reply")
    p.add_argument("--replies", type=int, default=3, help="replies each attacker looks inside")
    p.add_argument("--floods", default="inside,loops", help="inside, loops, or both (comma-separated)")
    p.add_argument("--nginx", action="store_true", help="every client through nginx (deploy/nginx.conf), as deployed")
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args(argv)
    load_before = common.load_average()
    rows: list[list] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        envs = {"bundled": {}, "26m": random_26m(folder / "26m")}
        for name in args.models.split(","):
            for share in args.shares.split(","):
                rows += measure(name, envs[name], share, args, folder)
                print(common.table(HEADER, rows[-3:]), flush=True)
    body = (common.table(HEADER, rows)
            + f"\n\n- real gunicorn per row group (1 torch thread), {WAY[args.nginx]}; the good user "
              f"{args.seconds:g} s per case, "
              f"max_new_tokens {args.tokens}; floods from 4 addresses x 3 at a time; bound = 2 x unloaded p95 + 50 ms; "
              "26m = random GPT-2-BPE weights, n_layer 4, n_head 6, n_embd 384 (its replies run to max_new_tokens)")
    common.report("Whole jobs against a good user's reply (GLASSBOX_BULK_SHARE)", body, load_before=load_before,
                  write_doc=not args.no_doc)
    return 0 if all(r[9] == "yes" for r in rows if r[1] != "1") else 1


WAY = {False: "straight to it", True: "behind nginx (deploy/nginx.conf)"}
HEADER = ["model", "bulk share", "flood", "replies", "decode tok/s", "vs alone", "TTFT p50 ms", "TTFT p95 ms",
          "p95 bound ms", "within", "flood's requests"]

if __name__ == "__main__":
    sys.exit(main())
