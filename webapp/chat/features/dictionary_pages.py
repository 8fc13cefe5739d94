"""Dictionaries from the page (webapp/chat/features/training.py): every model's dictionaries with their figures,
a form that trains a new one on an uploaded corpus, and the training job's page, whose progress streams over SSE
(htmx) and which reloads itself without JavaScript; Stop ends it at the next step."""

from __future__ import annotations

from typing import Any

from flask import abort, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from webapp.chat.features.training import MAX_CORPUS_BYTES, TrainingService
from webapp.chat.features.training_jobs import TrainRequest
from webapp.chat.service import ChatError
from webapp.chat.web.blueprint import bp, service
from webapp.core import Refused
from webapp.core.jobs import FINISHED, AnyJob, Event
from webapp.web import refusal_status
from webapp.web.security import owner_id
from webapp.web.sse import finished_stream, stream_job
from webapp.web.state import glassbox


def training() -> TrainingService:
    return glassbox().service(TrainingService)


@bp.get("/dictionaries")
def dictionaries_page() -> ResponseReturnValue:
    models = service().models
    listed = {name: list((models.get(name).dictionaries or {}).values()) for name in models.names()}
    return render_template("chat/dictionaries.html", listed=listed, error=request.args.get("error"),
                           max_mib=MAX_CORPUS_BYTES // 2**20)


@bp.post("/dictionaries")
def train_dictionary() -> ResponseReturnValue:
    """The form: model, name, layer, width, k, tokens and a corpus file -> the training job's page."""
    upload = request.files.get("corpus")
    try:
        if upload is None or not upload.filename:
            raise ChatError("Choose a corpus file (.txt or .jsonl).", 400)
        model, wanted = training().request(request.form.get("model"), dict(request.form), upload.filename,
                                           upload.read(MAX_CORPUS_BYTES + 1))
        job = training().start(owner_id(), model, wanted)
    except ChatError as error:
        return render_page_error(str(error), error.status)
    except Refused as error:
        return render_page_error(str(error), refusal_status(error))
    return redirect(url_for("chat.training_page", job_id=job.id), 303)


def render_page_error(message: str, status: int) -> ResponseReturnValue:
    models = service().models
    listed = {name: list((models.get(name).dictionaries or {}).values()) for name in models.names()}
    return render_template("chat/dictionaries.html", listed=listed, error=message,
                           max_mib=MAX_CORPUS_BYTES // 2**20), status


def owned_job(job_id: str) -> AnyJob:
    job = glassbox().core.get(job_id)
    if job is None or job.owner != owner_id() or not isinstance(job.request, TrainRequest):
        abort(404, "No such training job (it ended a while ago, or it is not yours).")
    return job


@bp.get("/dictionaries/jobs/<job_id>")
def training_page(job_id: str) -> ResponseReturnValue:
    job = owned_job(job_id)
    return render_template("chat/training.html", **view(job))


@bp.get("/dictionaries/jobs/<job_id>/events")
def training_events(job_id: str) -> ResponseReturnValue:
    """Each step's progress as a fragment, then the finished section (`done`)."""
    job = owned_job(job_id)
    if job.state in FINISHED:
        return finished_stream(render_template("chat/_training.html", **view(job)))
    def render(event: Event) -> str | None:
        if event.name != "progress":
            return None
        return render_template("chat/_training_progress.html", progress=event.data, total=job.request.tokens)

    return stream_job(job, render, lambda finished: render_template("chat/_training.html", **view(finished)))


@bp.post("/dictionaries/jobs/<job_id>/stop")
def training_stop(job_id: str) -> ResponseReturnValue:
    owned_job(job_id).cancel()
    return redirect(url_for("chat.training_page", job_id=job_id), 303)


def view(job: AnyJob) -> dict[str, Any]:
    wanted: TrainRequest = job.request
    return {"job": job, "wanted": wanted, "total": wanted.tokens, "progress": job.result.progress,
            "figures": job.result.figures,
            "live": job.state not in FINISHED, "model": job.kind.partition(":")[2] or service().models.default}
