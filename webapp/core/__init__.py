"""The shared inference core: device ownership, the step scheduler, jobs and their event logs.

It knows nothing of Flask or HTTP: requests are data, the scheduler decides, the worker executes.
The web glue (streams, stream slots, refusals as HTTP answers) is in webapp/web."""

from webapp.core.engine import InferenceCore
from webapp.core.jobs import Event, Job, JobCancelled
from webapp.core.refusals import CoreClosed, QueueFull, Refused, TooManyFromClient, TooManyJobs

__all__ = ["CoreClosed", "Event", "InferenceCore", "Job", "JobCancelled", "QueueFull", "Refused", "TooManyFromClient",
           "TooManyJobs"]
