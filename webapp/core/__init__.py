"""The shared inference core: device ownership, the job queue, jobs and streaming."""

from flask import current_app

from webapp.core.engine import CoreClosed, InferenceCore, QueueFull, TooManyJobs
from webapp.core.jobs import Event, Job, JobCancelled


def get_core() -> InferenceCore:
    return current_app.extensions["glassbox.core"]


__all__ = ["CoreClosed", "Event", "InferenceCore", "Job", "JobCancelled", "QueueFull", "TooManyJobs", "get_core"]
