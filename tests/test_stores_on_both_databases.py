"""The trace store, the read-only links and the browsers table do the same on SQLite and on PostgreSQL:
the SQL that differs between the two (ON CONFLICT, RETURNING, LIMIT, substr, the owner prefix) is run on
a fresh database of each kind."""

from __future__ import annotations

import json
import time

from webapp.browsers import NEW_BROWSER_SECONDS, Browsers
from webapp.chat.decode.types import ReplyStats
from webapp.chat.store import ChatStore
from webapp.db import open_database
from webapp.loops.store import TraceStore


def opened(location: str):
    database = open_database(location)
    database.init()
    return database


def snapshot(n: int) -> dict:
    return {"request": {"n": n}, "source": "run", "summary": {}}


def test_traces_roll_expire_and_are_shared_once(database_location):
    traces = TraceStore(opened(database_location))
    made = []
    for n in range(5):
        made.append(traces.save("me", snapshot(n)))
        time.sleep(0.002)  # distinct times: the newest are kept
    other = traces.save("you", snapshot(9))
    traces.keep_newest("me", 2)
    assert [t["id"] for t in traces.recent("me")] == made[:2:-1]
    assert traces.get("you", other) == snapshot(9) and traces.get("you", made[4]) is None
    token = traces.share("me", made[4])
    assert token and traces.share("me", made[4]) == token == traces.share_token("me", made[4])
    assert traces.share("you", made[4]) is None and traces.shared(token) == snapshot(4)
    traces.unshare("me", made[4])
    assert traces.shared(token) is None
    api = traces.save("api:x", snapshot(7))
    assert traces.delete_older("api:", time.time() + 1) == 1 and traces.get("api:x", api) is None
    assert traces.stored_bytes("me") == sum(len(json.dumps(snapshot(n))) for n in (3, 4))
    many = [f"owner{n}" for n in range(1200)]  # more owners than one IN (...) binds
    assert traces.stored_bytes(*many, "me", "you") == traces.stored_bytes("me") + len(json.dumps(snapshot(9)))
    assert traces.forget_owner("me") == 2 and traces.stored_bytes("me") == 0 and traces.get("you", other)


def test_a_conversation_is_shared_once_and_its_link_stops(database_location):
    chat = ChatStore(opened(database_location))
    turn = chat.begin_turn("me", None, user_text="hello", branch_from=None, settings={}, prompt={"ids": [1]})
    token = chat.share_conversation("me", turn.conversation_id)
    assert token and chat.share_conversation("me", turn.conversation_id) == token
    assert chat.share_conversation("you", turn.conversation_id) is None
    assert chat.shared_conversation(token).id == turn.conversation_id
    chat.stop_sharing("me", turn.conversation_id)
    assert chat.shared_conversation(token) is None
    chat.take_back_turn("me", turn)
    assert chat.conversations("me") == []
    for owner in ("me", "you", "me"):
        chat.begin_turn(owner, None, user_text="hello", branch_from=None, settings={}, prompt={})
    assert chat.stored_bytes("me", "you") == 3 * len("hello{}")  # each question and its reply's prompt
    assert chat.forget_owner("me") == 2 and chat.conversations("me") == [] and len(chat.conversations("you")) == 1


def test_browsers_are_recorded_counted_by_address_and_forgotten(database_location):
    database = opened(database_location)
    browsers, chat = Browsers(database), ChatStore(database)
    stores = (chat, TraceStore(database))
    now = time.time()
    browsers.made("old", "10.0.0.1", now - NEW_BROWSER_SECONDS - 60)
    browsers.made("new1", "10.0.0.1", now)
    browsers.made("new1", "10.0.0.9", now)  # made once: the first address stays
    browsers.made("new2", "10.0.0.1", now)
    chat.begin_turn("new1", None, user_text="x" * 10, branch_from=None, settings={}, prompt={})
    chat.begin_turn("old", None, user_text="y" * 100, branch_from=None, settings={}, prompt={})
    assert browsers.new_browsers_bytes("new2", stores, now) == 10 + len("{}")  # the question and the reply's prompt
    assert browsers.new_browsers_bytes("old", stores, now) is None
    browsers.seen("old", "10.0.0.1", now)
    browsers.seen("unknown", "10.0.0.2", now - 10 * NEW_BROWSER_SECONDS)
    assert browsers.idle(now - 1, 10) == ["unknown"]
    browsers.forget("unknown")
    assert set(browsers.idle(now + 1, 10)) == {"new1", "new2", "old"}


def test_a_reply_holding_a_nul_is_saved(database_location):
    """A model may write a NUL (PostgreSQL's text cannot hold one: it is kept as U+FFFD there)."""
    chat = ChatStore(opened(database_location))
    turn = chat.begin_turn("me", None, user_text="hi", branch_from=None, settings={}, prompt={})
    chat.save_progress(turn.reply_id, "a\x00")
    chat.finish_reply(turn.reply_id, "a\x00b", "complete", None, ReplyStats())
    saved = chat.messages(turn.conversation_id)[-1].content
    assert saved in ("a\x00b", "a\ufffdb")
