"""The leases of the replies this front end runs or has queued (webapp/chat/store.py, REPLY_LEASE_SECONDS):
renewed together on a thread of their own, which also reads what other front ends asked of them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from webapp.chat.records import ReplySignals
from webapp.chat.store import LEASE_RENEW_SECONDS, ChatStore

log = logging.getLogger(__name__)


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
