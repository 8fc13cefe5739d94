"""A sweep's results section, live or saved, and the lab page with the sweep form's errors."""

from __future__ import annotations

from flask import render_template, url_for

from webapp.loops.sweep import MEASURES
from webapp.loops.web import state_pictures
from webapp.loops.web.blueprint import model_choices
from webapp.loops.web.forms import EditorState
from webapp.loops.web.render import render_lab
from webapp.loops.web.sweep_charts import MEASURE_LABELS, model_view
from webapp.loops.web.sweep_form import FAMILY_LABELS, SweepForm

SHOWN_DISAGREEMENTS = 50  # each carries two forms of the whole table: the rest are in the sweep's file


def render_lab_with_sweep(form: SweepForm, status: int = 200):
    return render_lab(EditorState.default(), sweep_form=form, status=status)


def label_of(name: str) -> str:
    return next((m["label"] or m["name"] for m in model_choices() if m["name"] == name), name)


def render_sweep(snapshot: dict, *, job=None, sweep_id: str | None = None, share_token: str | None = None,
                 shared: bool = False, error: str | None = None, fragment: str | None = None,
                 stream_url: str | None = None) -> str:
    """The results section (fragment="progress": only what fills in as k lines finish); a live one follows
    `stream_url` (None: its owner's stream of the job)."""
    spec = snapshot["spec"]
    max_k = max(spec["k"])
    lines = snapshot["lines"]
    trained = {c["name"]: (c.get("trained_k") or [None, None])[1] for c in model_choices()}
    models = [{"name": m, "label": label_of(m),
               **model_view([line for line in lines if line["model"] == m], max_k, list(spec["k"]), trained.get(m))}
              for m in spec["model"]]
    summary = snapshot.get("summary")
    done = sum(line["n"] for line in lines)
    total = len(spec["k"]) * spec["tables"] * len(spec["model"])
    differ = (summary or {}).get("disagreements", [])
    live = job is not None and not job.finished_state
    context = {"spec": spec, "models": models, "summary": summary, "done": done, "total": total,
               "measures": MEASURES, "measure_labels": MEASURE_LABELS, "family_label": FAMILY_LABELS[spec["family"]],
               "disagreements": differ[:SHOWN_DISAGREEMENTS], "disagreeing": len(differ), "live": live, "job": job,
               "sweep_id": sweep_id, "shared": shared,
               "stream_url": stream_url or (url_for("loops.sweep_stream", job_id=job.id) if live else None),
               "probes": [(label_of(m), p) for m, p in ((summary or {}).get("probe") or {}).items()],
               "sweep_paths": [(label_of(m), state_pictures.sweep_paths(p))
                               for m, p in ((summary or {}).get("paths") or snapshot.get("paths") or {}).items()],
               "share_token": share_token, "error": error,
               "share_url": url_for("loops.shared", token=share_token, _external=True) if share_token else None}
    if fragment == "progress":
        return render_template("loops/_sweep_progress.html", **context)
    return render_template("loops/_sweep.html", **context)
