"""The application's state: what create_app builds once and every request reads, in one typed object kept
in `app.extensions["glassbox"]` and read through `glassbox()`.

The web layer names what it owns (the database, the browsers, the core, the counts, the API keys, the
demos' stores as OwnerStore); it does not know the demos. Each demo's services are kept here too, and
each demo finds its own by its class (`glassbox().service(ChatService)`), so no demo needs another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from flask import Flask, current_app

from webapp.browsers import Browsers, OwnerStore
from webapp.core import InferenceCore
from webapp.core.metrics import LatencyHistogram
from webapp.db import AnyDatabase
from webapp.instance import InstanceLock, NoLock
from webapp.web.api_keys import ApiKeys
from webapp.web.counts import BulkShare, ClientStreams, HeavyReads, NewSessions, OpenStreams
from webapp.web.encoded import KeptAnswers

Service = TypeVar("Service")


@dataclass
class Glassbox:
    db: AnyDatabase
    browsers: Browsers
    lock: InstanceLock | NoLock  # released when the core shuts down
    core: InferenceCore
    new_sessions: NewSessions  # GLASSBOX_MAX_NEW_SESSIONS_PER_MINUTE
    api_keys: ApiKeys | None  # GLASSBOX_API_KEYS; None: the APIs are open (webapp/web/api_auth.py)
    heavy_reads: HeavyReads  # GLASSBOX_HEAVY_READ_BYTES_PER_SECOND (webapp/web/heavy.py)
    services: tuple[object, ...] = ()  # the demos' services (webapp/chat/boot.py, webapp/loops/boot.py)
    stores: tuple[OwnerStore, ...] = ()  # what the quotas and the retention ask (webapp/browsers.py)
    followers: dict[str, Any] = field(default_factory=dict)  # a follow link's kind -> its Follower (web/follow.py)
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)  # of the pages and API calls (/metrics)
    client_streams: ClientStreams = field(default_factory=ClientStreams)  # webapp/web/streams.py
    bulk_streams: BulkShare = field(default_factory=BulkShare)
    open_streams: OpenStreams = field(default_factory=OpenStreams)  # of GLASSBOX_MAX_STREAMS
    # a room's followers: a pool of their own (GLASSBOX_MAX_FOLLOWER_STREAMS), so a room never takes the
    # presenter's and other users' streams
    follower_streams: OpenStreams = field(default_factory=OpenStreams)
    follower_clients: ClientStreams = field(default_factory=ClientStreams)
    kept_answers: KeptAnswers = field(default_factory=KeptAnswers)  # heavy answers as bytes (webapp/web/heavy.py)

    def service(self, kind: type[Service]) -> Service:
        """The service of that class create_app built."""
        for service in self.services:
            if isinstance(service, kind):
                return service
        raise LookupError(f"No {kind.__name__} in this app (create_app builds the services)")


def glassbox(app: Flask | None = None) -> Glassbox:
    """The state of `app`, or of the app handling this request."""
    return cast(Glassbox, (current_app if app is None else app).extensions["glassbox"])
