"""The replies this front end runs or has queued: their leases (webapp/chat/store.py, REPLY_LEASE_SECONDS),
renewed together on a thread of their own, which also reads what other front ends asked of them; and their
records, written from the core's worker as they grow and when they end."""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg

from webapp.chat.decode import readings
from webapp.chat.decode.types import ChatJob
from webapp.chat.records import ReplySignals, Status
from webapp.chat.store import LEASE_RENEW_SECONDS, ChatStore
from webapp.core.jobs import CANCELLED, DONE, JobState
from webapp.db import SaveFailed, public_reason

log = logging.getLogger(__name__)
T = TypeVar("T")
STATUS_OF_OUTCOME = {DONE: Status.COMPLETE, CANCELLED: Status.STOPPED}  # anything else is an error


class Leases:
    """Keeps the leases of the replies this front end runs or has queued: every LEASE_RENEW_SECONDS, one
    UPDATE for all of them, on a thread that runs while there are any. A queued reply saves nothing, and a
    running one saves only as it produces, so without this a long wait would look like a dead front end
    to the others (ChatStore.reply_progress); the same round reads what other front ends asked (Stop), so
    a reply still waiting in line is stopped too."""

    def __init__(self, store: ChatStore, heed: Callable[[int, ReplySignals], None]) -> None:
        self.store, self.heed = store, heed
        self._lock = threading.Lock()
        self._held: set[int] = set()
        self._thread: threading.Thread | None = None

    def hold(self, message_id: int) -> None:
        with self._lock:
            self._held.add(message_id)
            if self._thread is None:
                self._thread = threading.Thread(target=self._renew, name="glassbox-leases", daemon=True)
                self._thread.start()

    def let_go(self, message_id: int) -> None:
        with self._lock:
            self._held.discard(message_id)

    def _renew(self) -> None:
        while True:
            time.sleep(LEASE_RENEW_SECONDS)
            with self._lock:
                held = sorted(self._held)
                if not held:
                    self._thread = None
                    return
            try:
                asked = self.store.renew_leases(held)
            except Exception as error:  # the database is away: the next round tries again
                log.warning("renewing the leases of %d replies failed: %s", len(held), error)
                continue
            for message_id, signals in asked.items():  # a waiting reply reads them here: it saves nothing
                self.heed(message_id, signals)

    # -- on the core's worker ----------------------------------------------------------------
    def progress_saver(self, message_id: int) -> Callable[[ChatJob], None]:
        """The reply's text so far, saved as it grows (Job.on_progress), heeding what other front ends asked."""
        def save(job: ChatJob) -> None:
            heed(job, saving(lambda: self.store.save_progress(message_id, job.result.reply)))
        return save

    def finish_saver(self, message_id: int) -> Callable[[ChatJob, JobState, str | None], None]:
        """The reply's end, saved (Job.on_finish): its text, outcome and figures, its tokens' odds and features;
        its lease let go."""
        def save(job: ChatJob, outcome: JobState, error: str | None) -> None:
            result = job.result
            status = STATUS_OF_OUTCOME.get(outcome, Status.ERROR)
            odds, features = [o.as_row() for o in result.odds], readings.saved(result.features)
            stats = result.stats
            if job.started is not None:  # how long it waited for a free row, shown apart from its first token
                stats = dataclasses.replace(stats, wait_seconds=job.started - job.created)
            self.let_go(message_id)  # its end is saved next, or it stays pending for its lease only
            saving(lambda: self.store.finish_reply(message_id, result.reply, status, error, stats, odds, features))
        return save


def saving(write: Callable[[], T]) -> T:
    """A write of a running reply, its failure said in words a user may read (they are saved with the reply
    and shown under it: never the database's socket path or host)."""
    try:
        return write()
    except (sqlite3.Error, psycopg.Error) as error:
        raise SaveFailed(public_reason(error)) from error


def heed(job: ChatJob, signals: ReplySignals) -> None:
    if signals.followed:  # its stream is read on another front end
        job.watched_elsewhere()
    if signals.stop_requested:  # Stop pressed on another front end
        job.cancel()
