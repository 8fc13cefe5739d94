"""Settings, each read from a GLASSBOX_* environment variable (documented in README.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


MIN_SECRET_CHARS = 16  # a key that signs cookies must not be guessable


class ConfigError(Exception):
    """A setting has a value the app cannot use; the message names the variable."""


@dataclass(frozen=True)
class Settings:
    # Models
    chat_models: str = ""        # a TOML registry of chat models (webapp/chat/registry.py); empty: the one below
    chat_checkpoint: str = str(ROOT / "models/chat/model.safetensors")
    chat_arch: str = ""          # preset, n_layer=2,n_head=4,... or a JSON file; empty: from the checkpoint
    chat_tokenizer: str = ""     # "byte", "gpt2" (packaged) or "gpt2:/path/gpt2.tiktoken"; empty: from config.json
    chat_factory: str = ""       # "module:function", the owner's build_model(arch)
    loop_model: str = str(ROOT / "models/loops")  # directory, or "module:function"
    # Remote chat (webapp/chat/decode/remote/executor.py, docs/scaling.md): replies from OpenAI-compatible servers
    chat_backend: str = ""       # "openai:<base url>[,<base url>...]"; empty: the local chat model writes replies
    chat_backend_model: str = ""  # the "model" sent; empty: none (the server's one model)
    chat_backend_key_file: str = ""  # a file whose first line is the bearer key for the backends
    chat_backend_timeout: float = 60.0  # seconds to connect, and the longest wait for the next chunk
    chat_backend_wait_seconds: float = 30.0  # how long a reply waits for a backend that is down or starting
    chat_backend_retry_seconds: float = 10.0  # a failed backend is skipped this long, then health-checked
    chat_backend_max_replies: int = 64  # remote replies streaming at once (more wait in the queue)
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
    max_new_tokens: int = 200    # default for a reply; the form may ask for more, up to the window
    max_message_chars: int = 8000
    max_messages: int = 200      # per conversation
    inside_cache_entries: int = 32  # "Inside this token" reports kept in memory, least recently used forgotten
    inside_wait_seconds: float = 120.0  # how long an Inside page or JSON request waits for its job
    max_jobs_per_owner: int = 4  # queued or running at once
    # Limits a script cannot shed by dropping its cookie: per client address (as the trusted proxy says)
    max_jobs_per_client: int = 8           # queued or running at once, all browsers of one address: half a batch
    max_new_sessions_per_minute: int = 30  # new session cookies handed to one address
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
            try:
                values[f.name] = _flag(raw) if kind is bool else kind(raw)
            except ValueError:
                raise ConfigError(f"GLASSBOX_{f.name.upper()}={raw!r} is not a valid {kind.__name__}")
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
