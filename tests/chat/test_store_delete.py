"""Deleting a conversation: gone for its owner and its link at once, every row deleted in batches (a
deep tree and a wide one), nothing of anyone else's touched, and a deletion cut short finished on the
next start. An older database gets the index on messages.parent_id. On SQLite and on PostgreSQL."""

from __future__ import annotations

import sqlite3

from webapp.chat import store as chat_store
from webapp.chat.decode.types import ReplyStats
from webapp.chat.store import ROOT, ChatStore
from webapp.db import Database, open_database


def a_store(location: str) -> ChatStore:
    database = open_database(location)
    database.init()
    return ChatStore(database)


def grow(store: ChatStore, owner: str, turns: int, versions: int) -> str:
    conversation = None
    for turn in range(turns):
        ids = store.begin_turn(owner, conversation, user_text=f"q{turn}", branch_from=None, settings={},
                               prompt={"ids": [1]})
        conversation = ids.conversation_id
        store.finish_reply(ids.reply_id, "a", "complete", None, ReplyStats(), odds=[[1]])
        for _ in range(versions - 1):
            again = store.begin_turn(owner, conversation, user_text=None, branch_from=ids.user_id or ROOT,
                                     settings={}, prompt={"ids": [1]})
            store.finish_reply(again.reply_id, "b", "complete", None, ReplyStats(), odds=[[1]])
    assert conversation is not None
    return conversation


def count(store: ChatStore, sql: str) -> int:
    with store.db.connect() as db:
        return db.execute(sql).fetchone()[0]


def test_a_large_conversation_is_deleted_in_batches_and_nothing_else(database_location, monkeypatch):
    monkeypatch.setattr(chat_store, "DELETE_BATCH", 7)
    store = a_store(database_location)
    deep = grow(store, "me", turns=20, versions=1)   # a chain 40 deep
    wide = grow(store, "me", turns=2, versions=15)   # 15 versions of each reply
    kept = grow(store, "someone else", turns=2, versions=2)
    token = store.share_conversation("me", deep)
    assert token is not None
    assert not store.delete_conversation("someone else", deep)  # not theirs: nothing happens
    for conversation in (deep, wide):
        assert store.delete_conversation("me", conversation)
        assert store.conversation("me", conversation) is None
    assert store.shared_conversation(token) is None and store.conversations("me") == []
    assert count(store, "SELECT COUNT(*) FROM messages") == 6 == len(store.all_messages(kept))
    assert count(store, "SELECT COUNT(*) FROM reply_details") == 4
    assert count(store, "SELECT COUNT(*) FROM conversations") == 1


def test_a_deletion_cut_short_is_finished_on_the_next_start(database_location):
    store = a_store(database_location)
    grow(store, "me", turns=3, versions=1)
    with store.db.transaction() as db:  # what delete_conversation does first, then the process dies
        db.execute("UPDATE conversations SET owner = ? || owner", (chat_store.DELETING,))
    assert store.conversations("me") == []
    assert store.finish_deletions() == 1
    assert count(store, "SELECT COUNT(*) FROM messages") == 0
    assert count(store, "SELECT COUNT(*) FROM conversations") == 0


def test_an_older_database_gets_the_parent_index(tmp_path):
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:  # messages as a list, before they formed a tree
        db.execute("CREATE TABLE conversations (id TEXT PRIMARY KEY, owner TEXT NOT NULL, title TEXT NOT NULL,"
                   " created_at REAL NOT NULL, updated_at REAL NOT NULL)")
        db.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id TEXT NOT NULL,"
                   " role TEXT NOT NULL, content TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'complete',"
                   " error TEXT, settings TEXT, tokens INTEGER, ttft_seconds REAL, tokens_per_second REAL,"
                   " created_at REAL NOT NULL)")
    Database(path).init()
    with sqlite3.connect(path) as db:
        plan = db.execute("EXPLAIN QUERY PLAN SELECT id FROM messages WHERE parent_id = 1").fetchall()
    assert "messages_by_parent" in str(plan)
