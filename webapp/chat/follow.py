"""A reply that another front end runs, followed from the database (several front ends on one database,
docs/scaling.md). Its job lives in the process that started it; every other front end reads the row that
job saves as the reply grows (Job.on_progress: every PROGRESS_PIECES pieces or PROGRESS_SECONDS) and streams
the new text, until the row leaves 'pending'. Nothing here waits on another process: a front end that died
leaves its row pending, and the store says so (ChatStore.reply_progress), so a follower never hangs."""

from __future__ import annotations

import time
from collections.abc import Iterator

from webapp.chat.decode.publish import TokenEvent
from webapp.chat.records import Status
from webapp.chat.store import ChatStore
from webapp.core.jobs import Event

# How often a follower reads the row: a fraction of the owner's save interval, so text arrives within
# about one save of being written, at a few small reads a second per follower.
FOLLOW_POLL_SECONDS = 0.25


def follow_reply(store: ChatStore, message_id: int, heartbeat: float,
                 poll: float = FOLLOW_POLL_SECONDS) -> Iterator[Event | None]:
    """The reply's events as a stream on its own front end would give them: `running` once text comes,
    `token` events with the text saved since the last read (no odds: they are kept when it ends), and
    None after `heartbeat` seconds without news (the caller writes a keep-alive). Returns once the row
    is not pending any more (its final state is then in the row), is gone, or its front end died (the
    row is then saved as stopped)."""
    store.mark_followed(message_id)  # its own front end must not take it for an orphan nobody watches
    sent, running, quiet_since = 0, False, time.monotonic()
    while True:
        row = store.reply_progress(message_id)
        if row is None:
            return
        text = row.content
        if len(text) > sent:
            if not running:
                running = True
                yield Event("running", {})
            yield Event("token", TokenEvent(text[sent:]))
            sent, quiet_since = len(text), time.monotonic()
        if row.status != Status.PENDING:
            return
        if row.abandoned:  # the front end that ran it stopped answering: it will never end
            store.stop_abandoned(message_id)
            return
        if time.monotonic() - quiet_since >= heartbeat:
            quiet_since = time.monotonic()
            yield None
        time.sleep(min(poll, heartbeat))
