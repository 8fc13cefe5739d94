"""What every glass-box experiment's views on a reply share, written once: the model that wrote the reply,
when the experiment can run on it here, and a request that waits for its job (holding a bulk stream slot)
with the refusals and failures made HTTP errors."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from contextlib import closing
from typing import Any, cast

from flask import g

from webapp.chat.inside.service import InsideService
from webapp.chat.records import Message
from webapp.chat.reports import Kept, ReportJobs, RequestT, ResultT
from webapp.chat.service import ChatError
from webapp.chat.web.blueprint import settings
from webapp.core import Refused
from webapp.core.jobs import CANCELLED, DONE, Job
from webapp.web import refusal_headers, refusal_status
from webapp.web.security import owner_id
from webapp.web.state import glassbox
from webapp.web.streams import held_slot

STILL_WORKING = ("Still working this out: the work goes on, and the same request asked again in a moment gets "
                 "it (or waits for the rest).")
NOT_SHOWN = ("The presenter has not opened this yet: it appears here once their page has worked it out "
             "(a follow link shows what the presenter shows, and starts no work of its own).")
RETRY_SECONDS = 10  # the Retry-After of a request that stopped waiting for a job still running


class InsideError(Exception):
    """An experiment's request refused or failed: its message, HTTP status and headers (Retry-After)."""

    def __init__(self, message: str, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.headers = status, headers or {}


def inside_service() -> InsideService:
    return glassbox().service(InsideService)


def runnable_writer(message: Message, experiment: str = "Inside cannot look into") -> str:
    """The model that wrote a reply, when it can be looked into here. Raises InsideError (409: another
    model or file, a remote backend, not nanoGPT's layout: "<experiment> this model: why.")."""
    inside = inside_service()
    try:
        model = inside.writer(message)
    except ChatError as error:
        raise InsideError(str(error), error.status) from None
    problem = inside.unavailable(model)
    if problem is not None:
        raise InsideError(problem.replace("Inside cannot look into", experiment), 409)
    return model


def report_or_wait(jobs: ReportJobs[RequestT, ResultT, Kept], model: str, request: RequestT, what: str,
                   result: str = "report") -> Kept:
    """A request's kept report, or the one its job works out while this request waits for it (started now, or
    the one already queued or running): wait_for_job's refusals and failures as InsideError."""
    found = jobs.report(model, request)
    if found is None and g.get("follower"):  # a follower reads what the presenter's page works out, never more
        running = jobs.job(model, request)
        if running is None or running.finished_state:
            raise InsideError(NOT_SHOWN, 409)
        job = wait_for_job(lambda: running, what, result)
        found = jobs.found(job.result)
    elif found is None:
        job = wait_for_job(lambda: jobs.start(owner_id(), model, request), what, result)
        found = jobs.found(job.result)
    if found is None:  # wait_for_job saw the job's result hold it: never, unless `result` names another field
        raise InsideError(f"Could not {what}: the job gave nothing.", 500)
    return found


def wait_for_job(start: Callable[[], Job[Any, Any]], what: str, result: str = "report") -> Job[Any, Any]:
    """Start a job (or join the one running) and wait for it in this request, holding a stream slot ->
    the job, done, its result's `result` attribute filled in. Raises InsideError: 429/503 (refused, or
    still running after GLASSBOX_INSIDE_WAIT_SECONDS), 500 (the job failed; `what` it could not do)."""
    try:
        # before the job: a refusal leaves nothing queued. A wait of many seconds that nobody watches token
        # by token: the bulk share, so a flood of cold reports leaves the other slots to live replies
        with held_slot(bulk=True) as slot:
            job = start()
    except Refused as error:
        raise InsideError(str(error), refusal_status(error), refusal_headers(error)) from None
    assert slot is not None
    deadline = time.monotonic() + settings().inside_wait_seconds
    with slot, closing(cast(Generator[Any, None, None], job.subscribe(settings().heartbeat_seconds))) as events:
        for _ in events:
            if time.monotonic() > deadline:  # the job goes on: asking again joins it, or finds its kept result
                job.keep_running()
                raise InsideError(STILL_WORKING, 503, {"Retry-After": str(RETRY_SECONDS)})
    if job.state == DONE and getattr(job.result, result, None) is not None:
        return job
    if job.state == CANCELLED:
        raise InsideError("Stopped before it was worked out (the server is shutting down?); try again.", 503)
    raise InsideError(f"Could not {what}: {job.error or 'the job failed'}.", 500)
