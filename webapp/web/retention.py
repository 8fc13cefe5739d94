"""Storage bounded across browsers (webapp/browsers.py): each browser is recorded when it is made and
when it comes back (once a day), and the rows of a browser not seen for GLASSBOX_RETENTION_DAYS are
deleted, a few browsers at a time, at most once a minute, by whichever request comes along: each store
create_app registered forgets the browser (OwnerStore, webapp/browsers.py), then its row goes."""

from __future__ import annotations

import logging
import threading
import time

from flask import current_app, request, session

from webapp.browsers import DAY, Browsers, OwnerStore
from webapp.db import DATABASE_ERRORS
from webapp.web.state import glassbox

log = logging.getLogger("glassbox")
PURGE_EVERY_SECONDS = 60.0
PURGE_BROWSERS = 50  # browsers deleted per purge, so that no request waits long for one
_purge_lock = threading.Lock()


def browsers() -> Browsers:
    return glassbox().browsers


def stores() -> tuple[OwnerStore, ...]:
    return glassbox().stores


def today() -> int:
    return int(time.time() // DAY)


def record_made(owner: str) -> None:
    """A new browser, from this request's address (as the trusted proxy reports it)."""
    try:
        browsers().made(owner, request.remote_addr or "")
        session["seen"] = today()
    except DATABASE_ERRORS as error:  # a full disk (or a database away) must not stop a page from showing
        log.warning("A new browser could not be recorded: %s", error)


def before_request() -> None:
    record_seen()
    purge_idle()


def record_seen() -> None:
    """Before each request: a browser's first request of the day records that it was seen."""
    owner = session.get("owner")
    if not isinstance(owner, str) or not owner or session.get("seen") == today():
        return
    try:
        browsers().seen(owner, request.remote_addr or "")
        session["seen"] = today()
    except DATABASE_ERRORS as error:
        log.warning("A browser's visit could not be recorded: %s", error)


def purge_idle(now: float | None = None) -> int:
    """Delete the rows of browsers idle past GLASSBOX_RETENTION_DAYS; at most once a minute. -> browsers."""
    days = current_app.config["GLASSBOX"].retention_days
    now = time.time() if now is None else now
    with _purge_lock:
        if not days or now - browsers().purged_at < PURGE_EVERY_SECONDS:
            return 0
        browsers().purged_at = now
    gone = 0
    try:
        for owner in browsers().idle(now - days * DAY, PURGE_BROWSERS):
            for store in stores():
                store.forget_owner(owner)
            browsers().forget(owner)  # last: a purge stopped halfway is taken up again by the next
            gone += 1
    except DATABASE_ERRORS as error:
        log.warning("Idle browsers could not be deleted now: %s", error)
    if gone:
        log.info("Deleted the rows of %d browsers not seen for %g days", gone, days)
    return gone
