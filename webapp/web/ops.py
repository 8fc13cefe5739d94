"""Operational endpoints: liveness, readiness and metrics (Prometheus text).

They carry no CSRF token and no session: GETs only, nothing about anyone's conversations."""

from __future__ import annotations

import threading

from flask import Blueprint, Response, jsonify

from webapp.core import InferenceCore
from webapp.core.metrics import OUTCOMES, LatencyHistogram, gauge, head
from webapp.web import get_core
from webapp.web.state import glassbox
from webapp.web.streams import OpenStreams, open_streams

bp = Blueprint("ops", __name__)


@bp.get("/healthz")
def healthz():
    return jsonify(status="ok")


@bp.get("/readyz")
def readyz():
    """200 once every model is loaded and warmed up; 503 before, and again once shutdown begins,
    so a load balancer stops sending work to a process that will not take it."""
    core = get_core()
    if core.ready.is_set() and core.accepting:
        # A process whose database cannot be written (disk full, read-only) would lose every reply.
        problem = glassbox().db.writable()
        if problem is None:
            return jsonify(status="ready", models=sorted(core.models))
        return jsonify(status="not ready", reason=f"the database cannot be written: {problem}"), 503
    reason = "shutting down" if not core.accepting else core.warmup_error or "warming up"
    return jsonify(status="not ready", reason=reason), 503


@bp.get("/metrics")
def metrics():
    body = exposition(get_core(), glassbox().latency, open_streams())
    return Response(body, mimetype="text/plain; version=0.0.4")


def thread_counts() -> dict[str, int]:
    """Python threads: gunicorn's request pool (bounded by its `threads`) and all others."""
    pool = sum(1 for t in threading.enumerate() if t.name.startswith("ThreadPoolExecutor"))
    return {"request_pool": pool, "other": threading.active_count() - pool}


def exposition(core: InferenceCore, latency: LatencyHistogram, streams: OpenStreams) -> str:
    counters = dict(core.counters)
    lines = (gauge("glassbox_queue_length", core.queue_length(), "Jobs waiting for the device")
             + gauge("glassbox_running_jobs", len(core.running_jobs()), "Jobs running (batched replies, whole runs)")
             + gauge("glassbox_kv_cache_bytes", core.memory_bytes(),
                      "KV-cache memory: running replies and kept prefixes")
             + gauge("glassbox_open_streams", streams.count, "Open SSE streams, each holding a thread")
             + gauge("glassbox_ready", int(core.ready.is_set()), "1 once the models are loaded and warmed up")
             + gauge("glassbox_accepting_jobs", int(core.accepting), "0 once shutdown has begun")
             + head("glassbox_threads", "gauge", "Python threads of the process"))
    lines += [f'glassbox_threads{{kind="{kind}"}} {n}' for kind, n in thread_counts().items()]
    lines += head("glassbox_jobs_total", "counter", "Jobs submitted, and finished by outcome")
    lines += [f'glassbox_jobs_total{{outcome="{o}"}} {counters.get(o, 0)}' for o in OUTCOMES]
    lines += core.job_metrics.lines()
    lines += core.step_metrics.lines()
    lines += (head("glassbox_tokens_total", "counter", "Chat tokens generated")
              + [f"glassbox_tokens_total {counters.get('tokens', 0)}"]
              + head("glassbox_loop_rows_total", "counter", "Loop-lab rows produced")
              + [f"glassbox_loop_rows_total {counters.get('rows', 0)}"]
              + head("glassbox_model_load_seconds", "gauge", "Time to load each model at start-up"))
    lines += [f'glassbox_model_load_seconds{{model="{name}"}} {seconds:.3f}'
              for name, seconds in core.load_seconds.items()]
    lines += head("glassbox_model_warmup_seconds", "gauge", "Time of each model's warm-up pass")
    lines += [f'glassbox_model_warmup_seconds{{model="{name}"}} {seconds:.3f}'
              for name, seconds in core.warmup_seconds.items()]
    lines += latency.lines("glassbox_request_seconds", help="Request latency, streams excluded")
    return "\n".join(lines) + "\n"
