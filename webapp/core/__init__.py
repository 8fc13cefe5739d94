"""The shared inference core: device ownership, the step scheduler, jobs and their event logs.

It knows nothing of Flask or HTTP: requests are data, the scheduler decides, the worker executes.
The web glue (streams, stream slots, refusals as HTTP answers) is in webapp/web."""

from webapp.core.engine import CoreClosed, InferenceCore, QueueFull, Refused, TooManyJobs
from webapp.core.jobs import Event, Job, JobCancelled

__all__ = ["CoreClosed", "Event", "InferenceCore", "Job", "JobCancelled", "QueueFull", "Refused", "TooManyJobs"]
