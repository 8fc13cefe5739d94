"""A busy room on one SQLite file (or one PostgreSQL database), through the real chat store, for a minute:
the issue's rates.

    .venv/bin/python -m bench.store.load                          # 60 s, this checkout
    .venv/bin/python -m bench.store.load --code /tmp/before       # the same with another revision's webapp/
    .venv/bin/python -m bench.store.load --database-url postgresql://…/empty   # on PostgreSQL

Two processes write the one database at once (as two servers, or a server and a script, would):
- process 1: 8 browsers each sending a message every second, and 4 browsers regenerating their last
  reply again and again, as fast as the store lets them;
- process 2: 16 browsers each sending a message every 3 seconds.
Every turn is what the app writes for a reply: begin_turn (the question and the pending reply), three
progress saves, finish_reply (text, figures, odds). Reported: turns, errors (a turn that raised, e.g.
"database is locked": its message would be lost), messages missing at the end, and begin_turn's
latency. tests/chat/test_store_concurrency.py runs the same in a few seconds.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import common

SCENARIOS = {  # process -> [(browsers, seconds between turns, regenerate)]
    "p1": [(8, 1.0, False), (4, 0.0, True)],
    "p2": [(16, 3.0, False)],
}


def browser(path: str, name: str, every: float, regenerate: bool, until: float, out: dict) -> None:
    from webapp.chat.decode.types import ReplyStats
    from webapp.chat.store import ChatStore
    store = ChatStore(database(path))
    conversation, turn, latencies, errors, saved = None, 0, [], [], []
    next_at = time.monotonic()
    while time.monotonic() < until:
        again = regenerate and conversation is not None
        try:
            parent = parent_of(store.messages(conversation)[-1]) if again else None
            started = time.perf_counter()
            ids = store.begin_turn(name, conversation, user_text=None if again else f"{name} #{turn}",
                                   branch_from=parent, settings={"turn": turn}, prompt={"ids": list(range(50))})
            latencies.append(time.perf_counter() - started)
            conversation = ids.conversation_id
            for n in range(3):
                store.save_progress(ids.reply_id, f"reply {name} #{turn}"[: 5 * (n + 1)])
            store.finish_reply(ids.reply_id, f"reply {name} #{turn}", "complete", None,
                               ReplyStats(tokens=5, ttft_seconds=0.01, tokens_per_second=100.0),
                               odds=[[1, 0.5, 0.5, 0, 1.0]] * 5)
            saved.append(turn)
        except Exception as error:  # counted: the browser goes on, as a person would retry
            errors.append(repr(error))
        turn += 1
        next_at += every
        time.sleep(max(0.0, next_at - time.monotonic()))
    out[name] = {"turns": turn, "saved": saved, "errors": errors, "latencies": latencies,
                 "conversation": conversation, "regenerate": regenerate}


def parent_of(message) -> int | None:
    """A message's parent: a record since Message, a dict in revisions before it (--code)."""
    return message["parent_id"] if isinstance(message, dict) else message.parent_id


def database(location: str):
    """The store's database: a SQLite file's path (any revision's webapp/), or a PostgreSQL URL."""
    import webapp.db
    if location.startswith("postgres"):
        return webapp.db.open_database(location)
    return webapp.db.Database(location)


def process(path: str, label: str, seconds: float, code: str | None) -> dict:
    if code:
        sys.path.insert(0, code)
    until, out, threads = time.monotonic() + seconds, {}, []
    for group, (count, every, regenerate) in enumerate(SCENARIOS[label]):
        for i in range(count):
            name = f"{label}-{group}-{i}"
            threads.append(threading.Thread(target=browser, args=(path, name, every, regenerate, until, out)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def lost(path: str, results: dict) -> int:
    """Turns reported saved whose question or reply is not in the database."""
    missing = 0
    with database(path).connect() as db:
        for name, r in results.items():
            replies = {row[0] for row in db.execute("SELECT content FROM messages WHERE role = 'assistant'"
                                                    " AND conversation_id = ?", (r["conversation"],))}
            missing += sum(f"reply {name} #{t}" not in replies for t in r["saved"])
    return missing


def quantile_ms(sorted_seconds: list[float], p: float) -> float:
    if not sorted_seconds:
        return float("nan")
    return sorted_seconds[min(len(sorted_seconds) - 1, int(p * len(sorted_seconds)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--code", help="import webapp from this folder (another revision's checkout)")
    parser.add_argument("--database-url", help="an empty PostgreSQL database instead of a SQLite file")
    parser.add_argument("--label", default="")
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args()
    if args.code:
        sys.path.insert(0, args.code)
    load = common.load_average()
    with tempfile.TemporaryDirectory() as folder:
        path = args.database_url or str(Path(folder) / "glassbox.sqlite3")
        database(path).init()
        with multiprocessing.get_context("fork").Pool(2) as pool:
            parts = pool.starmap(process, [(path, label, args.seconds, args.code) for label in SCENARIOS])
        results = {name: r for part in parts for name, r in part.items()}
        missing = lost(path, results)
    rows = []
    for label, groups in SCENARIOS.items():
        for group, (count, every, regenerate) in enumerate(groups):
            mine = [r for name, r in results.items() if name.startswith(f"{label}-{group}-")]
            latencies = sorted(x for r in mine for x in r["latencies"])
            what = f"{count} browsers " + ("regenerating, back to back" if regenerate else f"sending every {every:g} s")
            rows.append([label, what, sum(r["turns"] for r in mine), sum(len(r["errors"]) for r in mine),
                         quantile_ms(latencies, 0.5), quantile_ms(latencies, 0.99), quantile_ms(latencies, 1.0)])
    errors = sorted({e for r in results.values() for e in r["errors"]})
    code = f"webapp/ from {args.code}" if args.code else "this checkout's webapp/"
    where = "one PostgreSQL database (local, Unix socket)" if args.database_url else "one database file"
    body = (f"Code under test: {code}. {args.seconds:g} s, two processes on {where}; a turn is "
            "begin_turn, three progress saves and finish_reply.\n\n"
            + common.table(["process", "load", "turns", "errors", "begin_turn p50 ms", "p99 ms", "max ms"], rows)
            + f"\n\nMessages missing at the end (turns reported saved): {missing}."
            + (f" Errors seen: {'; '.join(errors[:3])}." if errors else " No errors."))
    title = (f"bench.store.load: the issue's writers for a minute on {'PostgreSQL' if args.database_url else 'SQLite'}"
             + (f", {args.label}" if args.label else ""))
    common.report(title, body, load_before=load, write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
