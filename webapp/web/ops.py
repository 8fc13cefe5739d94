"""Operational endpoints: liveness, readiness and metrics (Prometheus text).

They carry no CSRF token and no session: GETs only, nothing about anyone's conversations."""

from flask import Blueprint, Response, current_app, jsonify

from webapp.web import get_core
from webapp.core.metrics import exposition

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
        problem = current_app.extensions["glassbox.db"].writable()
        if problem is None:
            return jsonify(status="ready", models=sorted(core.models))
        return jsonify(status="not ready", reason=f"the database cannot be written: {problem}"), 503
    reason = "shutting down" if not core.accepting else core.warmup_error or "warming up"
    return jsonify(status="not ready", reason=reason), 503


@bp.get("/metrics")
def metrics():
    body = exposition(get_core(), current_app.extensions["glassbox.latency"])
    return Response(body, mimetype="text/plain; version=0.0.4")
