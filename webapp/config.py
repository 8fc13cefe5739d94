"""Settings, each read from a GLASSBOX_* environment variable (documented in docs/configuration.md)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


MIN_SECRET_CHARS = 16  # a key that signs cookies must not be guessable
PUBLIC_URL = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+/?")  # GLASSBOX_PUBLIC_URL: an origin, no path


class ConfigError(Exception):
    """A setting has a value the app cannot use; the message names the variable."""


@dataclass(frozen=True)
class Limit:
    """What a number setting may be: `low` to `high`, or 0 where 0 has a meaning of its own (`zero`)."""

    low: float
    high: float
    zero: str = ""  # what 0 means ("no limit", "torch's default", ...); empty: 0 is refused unless low is 0

    def allows(self, value: float) -> bool:
        return math.isfinite(value) and (self.low <= value <= self.high or (bool(self.zero) and value == 0))

    def says(self) -> str:
        allowed = f"a number from {self.low:g} to {self.high:g}"
        return f"{allowed}, or 0 ({self.zero})" if self.zero else allowed


DAY_MINUTES, MAX_THREADS = 1440, 256
# Every number setting's range: a value outside it stops start-up with one line naming the variable, the
# value and what is allowed (a nonsense value would otherwise start and break a feature: a busy loop of
# keep-alives, a worker that dies, history deleted while in use, every form refused).
LIMITS: dict[str, Limit] = {
    "chat_backend_timeout": Limit(0.1, 3600),
    "chat_backend_wait_seconds": Limit(0, 3600),
    "chat_backend_retry_seconds": Limit(0, 86400),
    "chat_backend_max_replies": Limit(1, 4096),
    "chat_backend_slots": Limit(0, 4096),
    "torch_threads": Limit(1, MAX_THREADS, zero="torch's default"),
    "chat_torch_threads": Limit(1, MAX_THREADS, zero="by the model's size"),
    "loop_torch_threads": Limit(1, MAX_THREADS, zero="the worker's"),
    "database_timeout": Limit(0.1, 3600),
    "heartbeat_seconds": Limit(0.05, 60),
    "max_queue": Limit(1, 100_000),
    "max_batch": Limit(1, 1024),
    "kv_cache_mb": Limit(0, 1_048_576),
    "max_streams": Limit(1, 10_000),
    "max_streams_per_client": Limit(1, 10_000, zero="no limit of its own"),
    "max_bulk_streams": Limit(0, 10_000),  # 0: no share of their own
    "max_follower_streams": Limit(1, 10_000, zero="followers take GLASSBOX_MAX_STREAMS slots"),
    "presentation_pace": Limit(0.5, 200, zero="as fast as the model writes"),
    "max_new_tokens": Limit(1, 1_000_000),
    "max_message_chars": Limit(1, 10_000_000),
    "max_messages": Limit(2, 1_000_000, zero="no limit"),
    "inside_cache_entries": Limit(0, 100_000),
    "inside_wait_seconds": Limit(1, 3600),
    "patching_max_cells": Limit(1, 10_000_000, zero="no limit"),
    "max_jobs_per_owner": Limit(1, 100_000, zero="no limit"),
    "sweep_max_tables": Limit(1, 100_000),
    "sweep_max_runs": Limit(1, 1_000_000),
    "max_jobs_per_client": Limit(1, 100_000, zero="no limit"),
    "bulk_share": Limit(0.05, 1),
    "max_new_sessions_per_minute": Limit(1, 100_000, zero="no limit"),
    "heavy_read_bytes_per_second": Limit(65_536, 2**40, zero="no limit"),
    "max_conversations": Limit(1, 10_000_000, zero="no limit"),
    "max_traces": Limit(1, 10_000_000, zero="no limit"),
    "max_stored_bytes": Limit(1024, 2**50, zero="no limit"),
    "api_retention_hours": Limit(1 / 60, 24 * 3650),
    "max_new_browser_bytes_per_address": Limit(1024, 2**50, zero="no limit"),
    # a browser's visit is recorded once a day: less than a day would delete a browser still in use
    "retention_days": Limit(1, 36500, zero="kept for ever"),
    "session_days": Limit(1, 3650),
    "max_body_bytes": Limit(1024, 2**31),
}


@dataclass(frozen=True)
class Settings:
    # Models
    chat_models: str = ""        # a TOML registry of chat models (webapp/chat/registry.py); empty: the one below
    chat_checkpoint: str = str(ROOT / "models/chat/model.safetensors")
    chat_arch: str = ""          # preset, n_layer=2,n_head=4,... or a JSON file; empty: from the checkpoint
    chat_tokenizer: str = ""     # "byte", "gpt2" (packaged) or "gpt2:/path/gpt2.tiktoken"; empty: from config.json
    chat_factory: str = ""       # "module:function", the owner's build_model(arch)
    # sparse dictionaries (SAELens folders, comma-separated; "none"); empty: dictionaries/ beside the checkpoint
    chat_dictionaries: str = ""
    loop_model: str = str(ROOT / "models/loops")  # directory, or "module:function"
    # Remote chat (webapp/chat/decode/remote/executor.py, docs/scaling.md): replies from OpenAI-compatible servers
    chat_backend: str = ""       # "openai:<base url>[,<base url>...]"; empty: the local chat model writes replies
    chat_backend_model: str = ""  # the "model" sent; empty: none (the server's one model)
    chat_backend_key_file: str = ""  # a file whose first line is the bearer key for the backends
    chat_backend_timeout: float = 60.0  # seconds to connect, and the longest wait for the next chunk
    chat_backend_wait_seconds: float = 30.0  # how long a reply waits for a backend that is down or starting
    chat_backend_retry_seconds: float = 10.0  # a failed backend is skipped this long, then health-checked
    chat_backend_max_replies: int = 64  # remote replies streaming at once (more wait in the queue)
    chat_backend_slots: int = 0  # replies each backend runs at once; 0: as it says (llama.cpp's /props), else no cap
    device: str = "cpu"
    dtype: str = ""              # float32, bfloat16, float16, int8 (precision.py); empty: bf16 on GPU, fp32 on CPU
    torch_threads: int = 0       # intra-op threads of the core's worker; 0 = torch's default
    chat_torch_threads: int = 0  # intra-op threads for chat replies; 0 = 1 for a small model, else the worker's
    loop_torch_threads: int = 1  # intra-op threads for Loop-lab runs; 0 = the worker's setting
    # Serving
    secret_key: str = ""         # empty: a random key kept in the instance folder
    instance_path: str = ""      # empty: ./instance
    # empty: SQLite in the instance folder; postgresql://...: PostgreSQL, several front ends (webapp/db/postgres.py)
    database_url: str = ""
    database_timeout: float = 10.0  # PostgreSQL: the longest connect, statement or wait for the writers' lock
    heartbeat_seconds: float = 1.0
    max_queue: int = 64
    max_batch: int = 16          # chat replies decoded together in one step
    kv_cache_mb: int = 1024      # finished replies' KV caches kept for follow-up turns, least recent evicted
    max_streams: int = 24
    max_streams_per_client: int = 6  # open streams one client address may hold (0: no limit of its own)
    # of max_streams, what replays of saved traces and non-streamed /v1 calls may hold together: the rest
    # stay for live replies (webapp/web/streams.py)
    max_bulk_streams: int = 8
    # follow links' streams, a pool of their own beside max_streams (a thread each: gunicorn.conf.py counts them)
    max_follower_streams: int = 100
    # where people reach this app (scheme://host[:port], no path): follow links and the QR code name it; empty:
    # the address the request came to (the proxy's Host, where it is trusted)
    public_url: str = ""
    # tokens a second a live reply is shown at, at most, to its page and its followers (0: as written)
    presentation_pace: float = 0.0
    max_new_tokens: int = 200    # default for a reply; the form may ask for more, up to the window
    max_message_chars: int = 8000
    max_messages: int = 200      # per conversation
    inside_cache_entries: int = 32  # "Inside this token" reports kept in memory, least recently used forgotten
    inside_wait_seconds: float = 120.0  # how long an Inside page or JSON request waits for its job
    patching_max_cells: int = 4096  # cells one activation-patching job may run (0: no limit)
    max_jobs_per_owner: int = 4  # queued or running at once
    sweep_max_tables: int = 100  # tables per k a Loop-lab sweep may ask for
    sweep_max_runs: int = 2000   # runs one sweep may make: k values × tables × models
    # Limits a script cannot shed by dropping its cookie: per client address (as the trusted proxy says)
    max_jobs_per_client: int = 8           # queued or running at once, all browsers of one address: half a batch
    max_new_sessions_per_minute: int = 30  # new session cookies handed to one address
    # the most of the worker's time whole jobs (Inside, Loop-lab runs) take while replies are running
    bulk_share: float = 0.4
    # Inside reports as JSON and trace files sent to one address (webapp/web/heavy.py); 0: no limit
    heavy_read_bytes_per_second: int = 4 * 2**20
    # Storage, per browser (webapp/web/quotas.py); 0: unlimited
    max_conversations: int = 200
    max_traces: int = 100                  # saved Loop-lab traces; the oldest go to make room
    max_stored_bytes: int = 64 * 2**20     # text kept: messages, reply details, traces
    api_retention_hours: float = 24.0      # JSON-API runs made without a cookie are deleted after this
    # Across browsers (webapp/browsers.py, webapp/web/retention.py); 0: unlimited, kept for ever
    max_new_browser_bytes_per_address: int = 256 * 2**20  # text kept by the browsers one address made in a day
    retention_days: float = 90.0           # a browser not seen this long loses its rows
    session_days: int = 30                 # lifetime of the session cookie
    max_body_bytes: int = 256 * 1024
    forwarded_allow_ips: str = ""  # TCP proxies whose X-Forwarded-* are believed (a Unix socket's peer always is)
    api_keys: str = ""           # a file of bearer keys for /v1 and /api/ (webapp/web/api_keys.py); empty: open

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env: Mapping[str, str] = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"GLASSBOX_{f.name.upper()}")
            if raw is None:
                continue
            kind: Any = type(f.default)
            name, limit = f"GLASSBOX_{f.name.upper()}", LIMITS.get(f.name)
            try:
                values[f.name] = _flag(raw) if kind is bool else kind(raw.strip() if kind is not str else raw)
            except ValueError:
                allowed = f": use {limit.says()}" if limit else ""
                raise ConfigError(f"{name}={raw!r} is not a valid {kind.__name__}{allowed}")
            if limit is not None and not limit.allows(values[f.name]):
                raise ConfigError(f"{name}={raw!r} is out of range: use {limit.says()}")
        if values.get("public_url") and not PUBLIC_URL.fullmatch(values["public_url"].strip()):
            raise ConfigError(f"GLASSBOX_PUBLIC_URL={values['public_url']!r} is not an address people reach the app at:"
                              " use scheme://host[:port], e.g. http://192.168.1.20:8080 (no path)")
        if "secret_key" in values and len(values["secret_key"].strip()) < MIN_SECRET_CHARS:
            raise ConfigError(f"GLASSBOX_SECRET_KEY is too short: use at least {MIN_SECRET_CHARS} random characters "
                              "(or leave it unset to keep a generated key in the instance folder)")
        return cls(**values)


def _flag(raw: str) -> bool:
    # bool("0") is True: spell the accepted words out
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(raw)
