"""Results whose save failed (a full disk, a read-only database). The job is announced as failed, with the
reason, so nobody is told a reply was kept that was not; it stays findable, and its result is saved again, as
failed with that reason, every SAVE_RETRY_SECONDS until it works: no reply stays pending in the database while
the process lives. Used by the core's worker (webapp/core/engine.py)."""

from __future__ import annotations

import logging
import threading
import time

from webapp.core.jobs import FAILED, AnyJob, JobState

log = logging.getLogger("glassbox.core")
SAVE_RETRY_SECONDS = 5.0  # how often a result whose save failed (disk full) is tried again


class Saves:
    def __init__(self) -> None:
        self._unsaved: dict[str, AnyJob] = {}
        self._lock = threading.Lock()
        self._last_try = 0.0

    def call_on_finish(self, job: AnyJob, outcome: JobState, error: str | None) -> tuple[JobState, str | None]:
        """Save before announcing the end, so a reload right after "done" finds the saved result.
        -> the outcome to announce: failed, with the reason, when the result could not be saved."""
        if job.on_finish is None:
            return outcome, error
        try:
            job.on_finish(job, outcome, error)
        except Exception as exc:
            log.error("saving job %s (%s) failed: %s", job.id, job.kind, exc)
            job.save_error = job.save_error or f"Could not save the result: {exc or type(exc).__name__}"
            with self._lock:
                self._unsaved[job.id] = job
            return FAILED, job.save_error
        return outcome, error

    def pending(self, job_id: str) -> bool:
        """Whether this job's result still waits to be saved (the core keeps such a job findable)."""
        return job_id in self._unsaved

    def retry_due(self) -> bool:
        return bool(self._unsaved) and time.monotonic() - self._last_try >= SAVE_RETRY_SECONDS

    def retry(self) -> None:
        """Save again, as failed with the reason the user was shown, the results whose last save failed, when
        a retry is due; on the first that fails again, the rest wait for the next round too."""
        if not self.retry_due():
            return
        self._last_try = time.monotonic()
        with self._lock:
            unsaved = list(self._unsaved.values())
        for job in unsaved:
            try:
                if job.on_finish is not None:
                    job.on_finish(job, FAILED, job.save_error)
            except Exception as exc:
                log.warning("saving job %s (%s) failed again: %s", job.id, job.kind, exc)
                return  # the disk is still full: try them all again later
            log.info("saved job %s (%s) at last", job.id, job.kind)
            with self._lock:
                self._unsaved.pop(job.id, None)


__all__ = ["SAVE_RETRY_SECONDS", "Saves"]
