"""The Loop lab's two blueprints (the pages, and the JSON API under /api/loops) and what their routes
share: the service, the settings, the models offered, a browser's own saved traces."""

from __future__ import annotations

from flask import Blueprint, abort, current_app

from webapp.config import Settings
from webapp.loops.runs import LoopRuns
from webapp.loops.service import LoopService
from webapp.web import get_core
from webapp.web.security import owner_id
from webapp.web.state import glassbox

bp = Blueprint("loops", __name__, url_prefix="/loops")
api = Blueprint("loops_api", __name__, url_prefix="/api/loops")
RUN_GONE = ("This run is no longer here (the server restarted, or another front end runs it). "
            "Finished runs are under Saved traces.")


def service() -> LoopService:
    """The Loop-lab service create_app built (webapp/loops/boot.py)."""
    return glassbox().service(LoopService)


def settings() -> Settings:
    return current_app.config["GLASSBOX"]


def model_choices() -> list[dict]:
    """The models the page offers (webapp/loops/service.py LoopRuns): the main one first."""
    runs = get_core().executors.get("loops")
    if isinstance(runs, LoopRuns):
        return runs.choices()
    return [{"name": "main", "label": "", "checkpoint": "", "card": None}]


def model_name(checkpoint: str) -> str:
    """Which offered model recorded a trace (by its checkpoint id); the main one when none matches."""
    return next((m["name"] for m in model_choices() if m["checkpoint"] == checkpoint), "main")


def owned_trace(trace_id: str) -> dict:
    snapshot = service().store.get(owner_id(), trace_id)
    if snapshot is None or "sweep" in snapshot:  # a sweep has its own page (webapp/loops/web/sweep.py)
        abort(404, "No such trace.")
    return snapshot


