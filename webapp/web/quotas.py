"""How much one browser may keep, and how long anonymous API runs are kept.

Every row belongs to an owner (a browser's cookie). Without bounds a script could fill the disk one
upload or one conversation at a time, so each owner has quotas (GLASSBOX_MAX_CONVERSATIONS,
GLASSBOX_MAX_TRACES, GLASSBOX_MAX_STORED_BYTES). A script that makes a new browser for every request
would get a fresh quota each time, so the browsers one address made in the last day share
GLASSBOX_MAX_NEW_BROWSER_BYTES_PER_ADDRESS. A full quota answers 403 with what to do; saved traces,
which have no delete button, roll instead: the oldest is removed to make room.

The bytes are asked of every store create_app registered (OwnerStore, webapp/browsers.py); a demo's own
quota is asked of the store its caller passes.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Protocol

from flask import abort, current_app, request, session

from webapp.browsers import Browsers, OwnerStore
from webapp.web.state import glassbox

API_OWNER_PREFIX = "api:"  # owners of JSON-API runs made without a session cookie
_purged = {"at": 0.0}
_purge_lock = threading.Lock()
PURGE_EVERY_SECONDS = 60.0


def _settings():
    return current_app.config["GLASSBOX"]


class Conversations(Protocol):
    """The chat's store (webapp/chat/store.py), as its quota asks it."""

    def count_conversations(self, owner: str) -> int: ...


class Traces(Protocol):
    """The Loop lab's store (webapp/loops/store.py), as its quota and the API runs' retention ask it."""

    def keep_newest(self, owner: str, keep: int) -> None: ...

    def delete_older(self, owner_prefix: str, before: float) -> int: ...


def _stores() -> tuple[OwnerStore, ...]:
    return glassbox().stores


def _browsers() -> Browsers:
    return glassbox().browsers


def stored_bytes(owner: str) -> int:
    """What an owner keeps, in characters of stored text: traces, messages, reply details."""
    return sum(store.stored_bytes(owner) for store in _stores())


def _check_bytes(owner: str, adding: int) -> None:
    limit, per_address = _settings().max_stored_bytes, _settings().max_new_browser_bytes_per_address
    # a new browser's fresh quota is shared with every browser its address made that day (None: not new)
    young = _browsers().new_from_address_of(owner) if per_address else None
    alone = young == [owner]  # the address's only new browser: its own bytes are the address's
    own = stored_bytes(owner) if limit or alone else 0
    if limit and own + adding > limit:
        abort(403, f"You have used this browser's storage ({limit // 2**20:,} MiB). "
                   "Delete some conversations to make room.")
    if young is not None:
        used = own if alone else sum(store.stored_bytes(*young) for store in _stores())
        if used + adding > per_address:
            abort(403, f"New browsers from your address have used the storage they may have in a day "
                       f"({per_address // 2**20:,} MiB). Use a browser that has been here before, or come back "
                       "tomorrow.")


def check_chat(store: Conversations, owner: str, *, new_conversation: bool) -> None:
    """Before a reply is saved: the conversation quota (for a new one) and the bytes quota."""
    limit = _settings().max_conversations
    if new_conversation and limit:
        count = store.count_conversations(owner)
        if count >= limit:
            abort(403, f"You have {count:,} conversations, the most one browser may keep. "
                       "Delete one to start another.")
    _check_bytes(owner, 0)


def check_traces(store: Traces, owner: str, adding: int = 0) -> None:
    """Before a trace is saved: make room under GLASSBOX_MAX_TRACES (the oldest go), then the bytes quota."""
    limit = _settings().max_traces
    if limit:
        store.keep_newest(owner, limit - 1)
    _check_bytes(owner, adding)


def api_owner(store: Traces, key_owner: str | None = None) -> str:
    """The owner of a JSON-API run. With API keys set, the key (`key_owner`): each key is one owner for
    GLASSBOX_MAX_JOBS_PER_OWNER whatever cookie it sends, and its runs are kept as anonymous runs are.
    Without keys: the session's browser when the script keeps its cookie; else a throwaway owner whose
    traces are deleted after GLASSBOX_API_RETENTION_HOURS (no cookie is set) from `store`."""
    purge_api_runs(store)
    if key_owner is not None:
        return key_owner
    owner = session.get("owner")
    if isinstance(owner, str) and owner:
        return owner
    # A throwaway owner is a new browser of its address, as a new cookie is: what its runs keep counts
    # against the address's share (GLASSBOX_MAX_NEW_BROWSER_BYTES_PER_ADDRESS), so a script cannot shed
    # the limit by never keeping a cookie.
    owner = API_OWNER_PREFIX + secrets.token_urlsafe(12)
    _browsers().made(owner, request.remote_addr or "")
    return owner


def purge_api_runs(store: Traces, now: float | None = None) -> int:
    """Delete anonymous API runs older than the retention; at most once a minute. -> rows deleted."""
    now = time.time() if now is None else now
    with _purge_lock:
        if now - _purged["at"] < PURGE_EVERY_SECONDS:
            return 0
        _purged["at"] = now
    before = now - _settings().api_retention_hours * 3600
    deleted = store.delete_older(API_OWNER_PREFIX, before)
    _browsers().forget_made_before(API_OWNER_PREFIX, before)  # their rows of new browsers go with them
    return deleted
