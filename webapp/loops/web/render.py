"""The Loop lab's page and its results section, rendered from a request's state or a trace's snapshot."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

from flask import render_template, request, url_for

from webapp.loops.reading import NOT_AVAILABLE
from webapp.loops.request import FORCE_CAP
from webapp.loops.states import SETTLED
from webapp.loops.task import SYMBOLS
from webapp.loops.verdict import of_trace
from webapp.loops.web import pictures, state_pictures
from webapp.loops.web.attention import attention_view
from webapp.loops.web.blueprint import bp, model_choices, service
from webapp.loops.web.forms import PRESET_LABELS, EditorState
from webapp.loops.web.present import presenting
from webapp.loops.web.sweep_form import FAMILY_LABELS, SweepForm
from webapp.web.security import owner_id


def editor_context(state: EditorState) -> dict:
    return {"state": state, "symbols": SYMBOLS, "presets": PRESET_LABELS, "models": model_choices(),
            "force_cap": FORCE_CAP}


def render_lab(state: EditorState, *, results: str = "", status: int = 200, upload_error: str | None = None,
               sweep_form: SweepForm | None = None):
    recent = service().store.recent(owner_id())
    return render_template("loops/page.html", results=results, recent=recent, upload_error=upload_error,
                           sweep_form=sweep_form or SweepForm.default(model_choices()), families=FAMILY_LABELS,
                           recent_sweeps=service().store.recent_sweeps(owner_id()), **presenting(),
                           **editor_context(state)), status


def current_loop(rows: list) -> int | None:
    """?loop=N: the player's position, as a link gives it (no JavaScript needed); None: the whole run."""
    loop = request.args.get("loop", type=int)
    return None if loop is None or not rows else min(max(loop, 1), len(rows))


def render_results(snapshot: dict, *, job=None, trace_id: str | None = None, error: str | None = None,
                   recent: list | None = None, current: int | None = None, player_url: str | None = None,
                   shared: bool = False, share_token: str | None = None, address: str | None = None) -> str:
    """The results section; with `recent`, also an out-of-band refresh of the saved-traces list.

    A finished trace gets the player: step links to `player_url` (its own page) with ?loop=N, and
    with `current` the rows after loop N held back and loop N's letter ringed on the graph. `address`: the
    page's own address once a live run is saved (static/room.js puts it in the address bar)."""
    summary = snapshot.get("summary")
    rows = snapshot.get("trace", [])
    req = snapshot["request"]
    if player_url is None and trace_id:
        player_url = url_for("loops.trace", trace_id=trace_id)
    context = {"snapshot": snapshot, "rows": rows, "summary": summary, "job": job, "trace_id": trace_id,
               "error": error, "steps": req["steps"], "recent": recent, "current": current,
               "player_url": player_url, "shared": shared, "share_token": share_token, "address": address,
               "compare_models": [m for m in model_choices() if m["checkpoint"] != snapshot.get("checkpoint")]
               if len(model_choices()) > 1 else [],
               "model_label": next((m["label"] for m in model_choices()
                                    if m["checkpoint"] == snapshot.get("checkpoint") and m["label"]), None)}
    if summary is not None:
        context["verdict"] = of_trace(req, rows, summary["stop_reason"], summary.get("head_stop"))
        context["graph"] = pictures.graph(req, rows, context["verdict"])
        context["chart"] = pictures.stop_chart(rows, req["steps"], snapshot["threshold"])
        context["settle"] = pictures.settle_chart(rows, context["chart"])
        context["run_state"] = state_context(snapshot, rows, context["verdict"], context["chart"])
        if rows:
            at = current or len(rows)
            context["current_symbol"] = rows[at - 1]["prediction"]
            context["current_x"] = context["chart"]["x_of"](at)
            context["attention"] = attention_view(snapshot, current)
    return render_template("loops/_results.html", **context)


def state_context(snapshot: dict, rows: list[dict], verdict, chart: dict) -> dict:
    """What the state section draws (templates/loops/_state.html)."""
    steps = snapshot["request"]["steps"]
    analyses = snapshot.get("analyses") or {}
    model = next((m for m in model_choices() if m["checkpoint"] == snapshot.get("checkpoint")), {})
    stopped = verdict.loops if verdict.stop != "never" else None
    return {"trajectory": state_pictures.trajectory(rows, steps, verdict.wrong_hop.loop if verdict.wrong_hop else None,
                                                    stopped),
            "attention_chart": state_pictures.attention_chart(rows, chart, analyses.get("attention_settles_at")),
            "near_k": state_pictures.near_k(rows, steps), "carries_state": bool(model.get("carries_state")),
            "settled": SETTLED, "no_attention": NOT_AVAILABLE, "state_suffix": ""}


@bp.app_template_global()
def saved_trace_name(trace: dict) -> dict:
    """What tells saved traces apart (issue 31: they all read "start A, k = 12"): when it was saved, the
    model, and the table (identity, or a short fingerprint of its rules in their order)."""
    saved = datetime.fromtimestamp(float(trace.get("created_at") or 0), UTC)
    pairs = [list(p) for p in trace["request"].get("mapping", [])]
    if pairs and all(s == d for s, d in pairs):
        table = "identity table"
    else:
        table = "table " + hashlib.sha256(json.dumps(pairs).encode()).hexdigest()[:4]
    checkpoint = trace.get("checkpoint") or ""
    model = next((m["label"] or m["name"] for m in model_choices() if m["checkpoint"] == checkpoint), None)
    return {"time": saved.strftime("%H:%M:%S"), "iso": saved.isoformat(timespec="seconds"),
            "day": saved.strftime("%Y-%m-%d"), "model": model or checkpoint or "model not recorded", "table": table}
