"""When the database cannot take a write: a full disk answers 507 and a lock held past the busy
timeout 503, each with what to do, the same way on every route (a page, an htmx fragment or JSON),
instead of a bare 500. Nothing was saved in either case: the transaction was rolled back whole.
With PostgreSQL, a database that cannot be reached (or went away mid-request) answers 503 too."""

from __future__ import annotations

import logging
import sqlite3

import psycopg
from psycopg import errors as pg_errors
from werkzeug.exceptions import HTTPException, ServiceUnavailable

from webapp.web.pages import http_error

log = logging.getLogger("glassbox")


class InsufficientStorage(HTTPException):
    code = 507
    name = "Insufficient Storage"
    description = ("The server's disk is full, so this was not saved. Nothing else was lost: try again "
                   "later, and tell whoever runs Glassbox if it goes on.")


DATABASE_BUSY = "The database is busy; nothing was saved. Try again in a moment."
DATABASE_AWAY = ("The database cannot be reached just now; nothing was saved. Try again in a moment, and tell "
                 "whoever runs Glassbox if it goes on.")


def database_error(error: sqlite3.OperationalError):
    code = (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF  # the primary code of an extended one
    if code == sqlite3.SQLITE_FULL:
        log.error("The database's disk is full: %s", error)
        return http_error(InsufficientStorage())
    if code == sqlite3.SQLITE_BUSY:
        log.warning("A write waited past the busy timeout: %s", error)
        return http_error(ServiceUnavailable(DATABASE_BUSY))
    raise error  # anything else is a fault: Flask answers 500 and logs it


def postgres_error(error: psycopg.Error):
    if isinstance(error, pg_errors.DiskFull):
        log.error("The database's disk is full: %s", error)
        return http_error(InsufficientStorage())
    if isinstance(error, (pg_errors.LockNotAvailable, pg_errors.QueryCanceled)):
        log.warning("A statement waited past GLASSBOX_DATABASE_TIMEOUT: %s", error)
        return http_error(ServiceUnavailable(DATABASE_BUSY))
    if isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError)):  # refused, timed out, cut off
        log.error("The database cannot be reached: %s", str(error).strip())
        return http_error(ServiceUnavailable(DATABASE_AWAY))
    raise error  # anything else is a fault: Flask answers 500 and logs it
