"""Operational endpoints: liveness, readiness and metrics."""

from flask import Blueprint, Response, current_app, jsonify

from webapp.core import get_core
from webapp.core.metrics import exposition

bp = Blueprint("core", __name__)


@bp.get("/healthz")
def healthz():
    return jsonify(status="ok")


@bp.get("/readyz")
def readyz():
    core = get_core()
    if core.ready.is_set():
        return jsonify(status="ready", models=sorted(core.models))
    reason = core.warmup_error or "warming up"
    return jsonify(status="not ready", reason=reason), 503


@bp.get("/metrics")
def metrics():
    body = exposition(get_core(), current_app.extensions["glassbox.latency"])
    return Response(body, mimetype="text/plain; version=0.0.4")
