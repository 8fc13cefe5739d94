"""Nothing acknowledged is lost when a process writing through the store is killed with -9: every turn
it reported saved (its commits returned) is in the database afterwards, its reply as far as it was saved.
On SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.conftest import ROOT
from webapp.chat.store import ChatStore
from webapp.db import open_database

WRITER = """
import sys
from webapp.chat.store import ChatStore
from webapp.db import open_database
store = ChatStore(open_database(sys.argv[1], runner="killed"))
conversation = None
for turn in range(1_000_000):
    ids = store.begin_turn("me", conversation, user_text=f"q{turn}", branch_from=None, settings={}, prompt={})
    conversation = ids.conversation_id
    store.save_progress(ids.reply_id, f"partial {turn}")
    print(conversation, ids.reply_id, turn, flush=True)  # acknowledged: both commits returned
"""


def test_a_writer_killed_with_minus_9_loses_nothing_it_acknowledged(database_location):
    open_database(database_location).init()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, database_location], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert writer.stdout is not None
    acknowledged = [writer.stdout.readline().split() for _ in range(40)]
    writer.send_signal(signal.SIGKILL)  # mid-write: it never stops between turns
    acknowledged += [line.split() for line in writer.stdout.read().splitlines() if line.strip()]
    writer.wait(10)
    assert len(acknowledged) >= 40 and acknowledged[0]
    open_database(database_location, runner="next").init()  # the next start, as the app does it
    store = ChatStore(open_database(database_location))
    conversation = acknowledged[0][0]
    kept = {m.id: m for m in store.all_messages(conversation)}
    for _, reply_id, turn in acknowledged:
        assert kept[int(reply_id)].content == f"partial {turn}"
        assert kept[int(reply_id)].status in ("pending", "stopped")
    assert [m.content for m in kept.values() if m.role == "user"][:len(acknowledged)] == [
        f"q{turn}" for _, _, turn in acknowledged]
