"""Deleting a large conversation: how long the delete takes and how long another writer waits meanwhile.

    .venv/bin/python -m bench.store.delete                        # 20k and 50k messages, this checkout
    .venv/bin/python -m bench.store.delete --code /tmp/before     # the same with another revision's webapp/

A conversation of N messages (turns in a chain, each reply with 499 more versions, as Regenerate makes
them; every reply with a reply_details row) is written straight into a fresh database made by the
code under test (its schema and indexes). Then ChatStore.delete_conversation runs while a second
thread writes to another conversation every 5 ms (one short write transaction, as a reply's progress
is saved): its longest wait is how long the delete held the write lock. A wait past the busy timeout
is an error ("database is locked"), counted.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import common

VERSIONS = 500  # each reply has 499 more versions (Regenerate, again and again)


def build(path: str, messages: int) -> None:
    """One conversation ('big') of `messages` rows and a small one ('probe') for the other writer."""
    with sqlite3.connect(path) as db:
        now = time.time()
        for cid in ("big", "probe"):
            db.execute("INSERT INTO conversations (id, owner, title, created_at, updated_at) VALUES (?, 'o', ?, ?, ?)",
                       (cid, cid, now, now))
        db.execute("INSERT INTO messages (conversation_id, role, content, created_at) VALUES ('probe', 'user', '', ?)",
                   (now,))
        parent, made, rows, details = None, 0, [], []
        next_id = 2
        while made < messages:
            question = next_id
            rows.append((question, "big", "user", "a question", now, parent))
            next_id, made = next_id + 1, made + 1
            for _ in range(min(VERSIONS, messages - made)):
                rows.append((next_id, "big", "assistant", "a reply " * 20, now, question))
                details.append((next_id, '{"ids":[1,2,3]}', "[" + ",".join(["[1,0.5,0.5,1,0.1]"] * 20) + "]"))
                parent, next_id, made = next_id, next_id + 1, made + 1
        db.executemany("INSERT INTO messages (id, conversation_id, role, content, created_at, parent_id)"
                       " VALUES (?, ?, ?, ?, ?, ?)", rows)
        db.executemany("INSERT INTO reply_details (message_id, prompt, odds) VALUES (?, ?, ?)", details)


def measure(messages: int) -> dict:
    from webapp.chat.store import ChatStore
    from webapp.db import Database
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "glassbox.sqlite3")
        database = Database(path)
        database.init()
        build(path, messages)
        store = ChatStore(database)
        waits: list[float] = []
        errors: list[str] = []
        done = threading.Event()

        def other_writer() -> None:
            while not done.is_set():
                started = time.perf_counter()
                try:
                    store.save_progress(1, "progress")
                except sqlite3.OperationalError as error:
                    errors.append(str(error))
                waits.append(time.perf_counter() - started)
                time.sleep(0.005)

        writer = threading.Thread(target=other_writer)
        writer.start()
        time.sleep(0.05)
        started, failed = time.perf_counter(), ""
        try:
            store.delete_conversation("o", "big")
        except sqlite3.Error as error:
            failed = str(error)
        seconds = time.perf_counter() - started
        time.sleep(0.05)
        done.set()
        writer.join()
        with sqlite3.connect(path) as db:
            left = db.execute("SELECT COUNT(*) FROM messages WHERE conversation_id = 'big'").fetchone()[0]
        return {"seconds": seconds, "longest_wait": max(waits), "writes": len(waits), "errors": len(errors),
                "left": left, "failed": failed or "—"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[20_000, 50_000])
    parser.add_argument("--code", help="import webapp from this folder (another revision's checkout)")
    parser.add_argument("--label", default="", help="named in the report (e.g. 'before')")
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args()
    if args.code:
        sys.path.insert(0, args.code)
    import webapp.db
    load = common.load_average()
    rows = []
    for n in args.messages:
        r = measure(n)
        rows.append([f"{n:,}", f"{r['seconds']:.3f}", f"{r['longest_wait'] * 1000:.0f}", r["writes"], r["errors"],
                     r["left"], r["failed"]])
    code = f"webapp/ from {args.code}" if args.code else "this checkout's webapp/"
    body = (f"Code under test: {code} ({webapp.db.__file__}). Another writer saves a reply's progress every "
            "5 ms during the delete; its longest wait is how long the delete held the write lock.\n\n"
            + common.table(["messages", "delete s", "other writer's longest wait ms", "other writes",
                            "other writer's errors", "rows left", "the delete's own error"], rows))
    title = "bench.store.delete: deleting a large conversation" + (f", {args.label}" if args.label else "")
    common.report(title, body, load_before=load, write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
