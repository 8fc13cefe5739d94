"""The Loop lab on the web: the blueprints (blueprint.py) and their routes — lab.py (the page, runs,
streams), traces.py (saved traces, sharing, replay, upload), present.py (follow links), api.py (the JSON API)."""

from webapp.loops.web import api as api_routes  # noqa: F401  (each registers its routes)
from webapp.loops.web import compare, lab, present, sweep, traces  # noqa: F401
from webapp.loops.web.blueprint import api, bp

__all__ = ["api", "bp"]
