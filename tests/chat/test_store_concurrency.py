"""Concurrent writers through the real chat store on one SQLite file, and on one PostgreSQL database: a
room of browsers sending and regenerating at once, from threads of one process and from two processes.
Every write goes through (no "database is locked", no serialization failure) and no message is lost.

The rates are the issue's (8 browsers each sending every second, 4 regenerating), compressed: each
"browser" sends its turns back to back, so the writers collide far more often than they would a second apart.
bench/store/load.py runs the same load paced, for a minute.
"""

from __future__ import annotations

import multiprocessing
import threading

from webapp.chat.decode.types import ReplyStats
from webapp.chat.store import ChatStore
from webapp.db import open_database

SENDERS = 8
REGENERATORS = 4
TURNS = 25


def browser(path: str, name: str, turns: int, regenerate: bool) -> list[str]:
    """One browser's turns, as the app makes them: begin_turn, progress, finish_reply. -> errors."""
    store, errors = ChatStore(open_database(path)), []
    conversation = None
    for turn in range(turns):
        try:
            again = regenerate and conversation is not None
            parent = store.messages(conversation)[-1].parent_id if again else None
            ids = store.begin_turn(name, conversation, user_text=None if again else f"{name} #{turn}",
                                   branch_from=parent, settings={"turn": turn}, prompt={"ids": [1, 2, 3]})
            conversation = ids.conversation_id
            store.save_progress(ids.reply_id, "half")
            store.finish_reply(ids.reply_id, f"reply {name} #{turn}", "complete", None,
                               ReplyStats(tokens=2, ttft_seconds=0.01, tokens_per_second=100.0), odds=[[1, 0.5]])
        except Exception as error:  # every failure is counted, none stops the browser
            errors.append(f"{name} turn {turn}: {error!r}")
    return errors


def room(path: str, prefix: str) -> list[str]:
    """SENDERS browsers sending and REGENERATORS regenerating, each on its own thread. -> errors."""
    errors: list[str] = []
    def run(name: str, regenerate: bool) -> None:
        errors.extend(browser(path, name, TURNS, regenerate))
    threads = [threading.Thread(target=run, args=(f"{prefix}send{i}", False)) for i in range(SENDERS)]
    threads += [threading.Thread(target=run, args=(f"{prefix}regen{i}", True)) for i in range(REGENERATORS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def check_nothing_lost(path: str, prefixes: list[str]) -> None:
    store = ChatStore(open_database(path))
    for prefix in prefixes:
        for i in range(SENDERS):
            [conversation] = store.conversations(f"{prefix}send{i}")
            shown = store.messages(conversation.id)
            assert [m.content for m in shown if m.role == "user"] == [f"{prefix}send{i} #{t}"
                                                                         for t in range(TURNS)]
            assert [m.content for m in shown if m.role == "assistant"] == [f"reply {prefix}send{i} #{t}"
                                                                              for t in range(TURNS)]
            assert all(m.status == "complete" for m in shown)
        for i in range(REGENERATORS):
            [conversation] = store.conversations(f"{prefix}regen{i}")
            replies = [m for m in store.all_messages(conversation.id) if m.role == "assistant"]
            assert [m.content for m in replies] == [f"reply {prefix}regen{i} #{t}" for t in range(TURNS)]
            assert len({m.parent_id for m in replies}) == 1  # every version answers the one question


def fresh(location: str) -> str:
    open_database(location).init()
    return location


def test_threads_of_one_process_write_at_once_without_errors_or_losses(database_location):
    path = fresh(database_location)
    assert room(path, "a-") == []
    check_nothing_lost(path, ["a-"])


def test_two_processes_write_one_file_at_once_without_errors_or_losses(database_location):
    path = fresh(database_location)
    # Forked (a spawned interpreter would import the whole app first): each process opens its own
    # connections, none is open in this one at the fork
    context = multiprocessing.get_context("fork")
    with context.Pool(2) as pool:
        results = pool.starmap(room, [(path, "p1-"), (path, "p2-")])
    assert results == [[], []]
    check_nothing_lost(path, ["p1-", "p2-"])
