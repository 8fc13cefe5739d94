"""Follow links (issue 31): 50 followers of one presenter's conversation on one machine, through real
gunicorn. Per token, the delay from its arriving at the presenter's stream to its arriving at each follower's
(p50, p95); and the presenter's own first token (send -> first token event) with no followers and with 50,
alternating rounds, median of each. Then the presenter replays the last reply (issue 51): per token, how far
each follower's copy is from the presenter's (p50, p95, the largest; the target is within 250 ms). Tiny test
model at 50 ms a token (tests/support/served_models.py), so the figures are the serving path's, not the model's.

    .venv/bin/python -m bench.serving.follow                 # 50 followers, 5 rounds of each
    .venv/bin/python -m bench.serving.follow --followers 20 --rounds 3
    .venv/bin/python -m bench.serving.follow --session       # followers of a presenting session's link
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import threading
import time
from html import unescape
from pathlib import Path

from bench import common
from tests.support.servers import Client, Gunicorn, model_env, stream_url, wait_until


def reader(client: Client, url: str, log: list, opened: threading.Event) -> threading.Thread:
    def read():
        for event in client.open_stream(url, timeout=300).events():
            log.append(event)
            opened.set()
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def one_reply(presenter: Client, cid: str, tokens: int) -> tuple[float, list]:
    """Send a question, read the presenter's stream -> (first token seconds, its token events)."""
    sent = time.monotonic()
    reply = presenter.post("/chat/send", {"content": "Tell me a story", "max_new_tokens": str(tokens),
                                          "conversation_id": cid}, htmx=True)
    own = [e for e in presenter.open_stream(stream_url(reply.text), timeout=300).events() if e.name == "token"]
    return own[0].at - sent, own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--followers", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--pace", type=float, default=20.0, help="the replay's tokens a second")
    parser.add_argument("--session", action="store_true",
                        help="the followers follow a presenting session's link (POST /present), not the conversation's")
    parser.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks-history.md")
    args = parser.parse_args()
    load_before = common.load_average()
    with tempfile.TemporaryDirectory() as work:
        # every follower here comes from one loopback address, which may hold a quarter of the followers' pool
        env = {**model_env(Path(work), chat_arch="tiny:0.05"), "GLASSBOX_MAX_STREAMS": str(args.followers + 20),
               "GLASSBOX_MAX_STREAMS_PER_CLIENT": "0", "GLASSBOX_MAX_FOLLOWER_STREAMS": str(4 * (args.followers + 4))}
        server = Gunicorn(Path(work) / "instance", env).start()
        try:
            presenter = Client(server.url)
            presenter.get("/chat/")
            first = presenter.post("/chat/send", {"content": "Hello", "max_new_tokens": "4"}, htmx=True)
            list(presenter.open_stream(stream_url(first.text)).events())
            cid = re.search(r"/chat/c/([^/]+)/m/", stream_url(first.text)).group(1)
            alone = [one_reply(presenter, cid, args.tokens)[0] for _ in range(args.rounds)]
            if args.session:
                presenter.post("/present", {"next": f"/chat/c/{cid}"})
                page = presenter.get(f"/chat/c/{cid}")
            else:
                page = presenter.post(f"/chat/c/{cid}/present")
            link = re.search(r'value="http://[^"]+?(/follow/[A-Za-z0-9_-]+)"', page.text).group(1)
            events = unescape(re.search(r'data-follow="([^"]+)"', Client(server.url).get(link).text).group(1))
            logs = [[] for _ in range(args.followers)]
            opened = [threading.Event() for _ in logs]
            threads = [reader(Client(server.url), events, log, o) for log, o in zip(logs, opened)]
            assert all(o.wait(60) for o in opened)
            followed, delays = [], []
            for _ in range(args.rounds):
                marks = [len(log) for log in logs]
                ttft, own = one_reply(presenter, cid, args.tokens)
                followed.append(ttft)
                want = len(own)
                assert wait_until(lambda marks=marks, want=want: all(  # type: ignore[misc]
                    sum(e.name == "token" for e in log[m:]) >= want for log, m in zip(logs, marks)), 60)
                for log, m in zip(logs, marks):
                    tokens = [e for e in log[m:] if e.name == "token"]
                    delays += [theirs.at - ours.at for theirs, ours in zip(tokens, own)]
            replay = (f"/chat/c/{cid}/m/{last_reply(presenter, cid)}/replay?pace={args.pace:g}&replay=1")
            marks = [len(log) for log in logs]
            own = [e for e in presenter.open_stream(replay, timeout=300).events() if e.name == "token"]
            assert wait_until(lambda: all(sum(e.name == "replay-token" for e in log[m:]) >= len(own)
                                          for log, m in zip(logs, marks)), 60)
            skews = [abs(theirs.at - ours.at) for log, m in zip(logs, marks)
                     for theirs, ours in zip([e for e in log[m:] if e.name == "replay-token"], own)]
            presenter.post("/present/stop" if args.session else f"/chat/c/{cid}/unpresent")
            for t in threads:
                t.join(30)
        finally:
            server.stop()
    p50, p95 = statistics.median(delays), statistics.quantiles(delays, n=20)[-1]
    a, f = statistics.median(alone), statistics.median(followed)
    body = common.table(
        ["followers", "replies × tokens", "follower delay p50 (ms)", "p95 (ms)", "presenter first token alone (ms)",
         f"with {args.followers} followers (ms)", "ratio"],
        [[args.followers, f"{args.rounds} × {args.tokens}", p50 * 1000, p95 * 1000, a * 1000, f * 1000, f / a]])
    title = "Follow links: followers of one presenter" + (" (a presenting session)" if args.session else "")
    common.report(title, body, load_before=load_before, write_doc=not args.no_doc)
    body = common.table(
        ["followers", "replay (tokens at tokens/s)", "follower's token off the presenter's, p50 (ms)", "p95 (ms)",
         "largest (ms)"],
        [[args.followers, f"{len(own)} at {args.pace:g}", statistics.median(skews) * 1000,
          statistics.quantiles(skews, n=20)[-1] * 1000, max(skews) * 1000]])
    common.report("Follow links: a replay, in step on every follower's screen", body, load_before=load_before,
                  write_doc=not args.no_doc)


def last_reply(client: Client, cid: str) -> str:
    """The id of the conversation's last message (its reply) as its page names it."""
    return re.findall(r'id="message-(\d+)"', client.get(f"/chat/c/{cid}").text)[-1]


if __name__ == "__main__":
    main()
