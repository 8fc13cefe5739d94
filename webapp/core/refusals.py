"""Why the core will not take a job now. One error type, `Refused`, whose `reason` the web layer maps to
an HTTP status in one place (webapp/web/__init__.py): the browser's own limit, or the server's state."""

from __future__ import annotations


class Refused(Exception):
    """The core will not take a job now. `reason` says why; the web layer maps it to an HTTP status."""

    reason = "busy"


class CoreClosed(Refused):
    reason = "closing"

    def __init__(self, message: str = "The server is shutting down; try again in a moment") -> None:
        super().__init__(message)


class QueueFull(Refused):
    reason = "busy"

    def __init__(self, message: str = "The server is busy; try again in a moment") -> None:
        super().__init__(message)


class TooManyJobs(Refused):
    """This owner already has as many jobs queued or running as one browser may."""

    reason = "too_many"
    message = "You already have runs or replies waiting or running. Wait for one to finish or stop it."

    def __init__(self) -> None:
        super().__init__(self.message)


class TooManyFromClient(Refused):
    """This client address already has as many jobs queued or running as one address may, whatever
    cookies it sends (a script that drops its cookie is a new browser, but the same address)."""

    reason = "too_many"
    message = ("Too many runs or replies are waiting or running from your address. Wait for some to finish; "
               "scripts: keep the session cookie and send one request at a time.")

    def __init__(self) -> None:
        super().__init__(self.message)
