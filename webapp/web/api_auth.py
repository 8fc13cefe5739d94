"""Who a script is: an API key (GLASSBOX_API_KEYS, webapp/web/api_keys.py) or, with no keys, its address.

With the setting unset, /v1 and the Loop-lab JSON API are as open as the pages, and a script is known
by its client address (as the trusted proxy reports it). With it set, every request to them needs
`Authorization: Bearer <key>` with a key from the file, and the key is the script's identity: the
per-owner limit (GLASSBOX_MAX_JOBS_PER_OWNER) then counts per key. Each API blueprint puts the check in
front of its own routes (`require_key`), and answers a refusal in its own error shape; one key opens them all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from flask import Blueprint, g, request
from flask.typing import ResponseReturnValue

from webapp.web.state import glassbox

log = logging.getLogger("glassbox.api")

OWNER_PREFIX = "api:"  # never a session owner (token_urlsafe has no colon): /v1 never sees a browser's data
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="glassbox"'}  # sent with every 401


def bearer_token() -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def authenticate() -> tuple[str | None, str | None]:
    """-> (owner, None) for a request that may go on, or (None, why not). Keeps the owner in g."""
    keys = glassbox().api_keys
    if keys is None:
        g.api_owner = OWNER_PREFIX + (request.remote_addr or "local")
        return g.api_owner, None
    token = bearer_token()
    if token is None:
        return None, ("You didn't provide an API key. This server needs one: send it in the Authorization "
                      "header as 'Authorization: Bearer YOUR_KEY'.")
    digest = keys.identify(token)
    if digest is None:
        return None, "Incorrect API key provided."
    g.api_owner = OWNER_PREFIX + "key-" + digest[:16]
    return g.api_owner, None


def api_owner() -> str:
    """The owner of this request's jobs (set by authenticate, which runs before every API view)."""
    return g.get("api_owner") or OWNER_PREFIX + (request.remote_addr or "local")


def key_owner() -> str | None:
    """The owner of the API key this request was authenticated with; None when no keys are set."""
    owner = g.get("api_owner")
    return owner if isinstance(owner, str) and owner.startswith(OWNER_PREFIX + "key-") else None


def require_key(bp: Blueprint, refuse: Callable[[str, bool], ResponseReturnValue]) -> None:
    """Check the key before every request to `bp`'s routes (and to no other blueprint's). A request
    refused hears `refuse(why, whether a key was sent)`, which answers 401 in the blueprint's own shape
    with CHALLENGE's header. The check runs with the app's own before-request functions, before the
    CSRF check and the body limit (registered after the blueprints, webapp/__init__.py), so a request
    without a valid key hears 401 whatever it sent."""

    @bp.before_app_request
    def _authenticate() -> ResponseReturnValue | None:
        if request.blueprint != bp.name:
            return None
        owner, refusal = authenticate()
        if owner is not None:
            return None
        sent = bearer_token() is not None
        log.info("api request refused: %s", "wrong key" if sent else "no key")
        return refuse(refusal or "Unauthorized", sent)
