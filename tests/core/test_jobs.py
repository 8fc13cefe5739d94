"""A job's watchers: the last subscriber leaving cancels it, unless it was kept running for a retry; a job
several browsers asked for is cancelled only when the last of them withdraws."""

from __future__ import annotations

from webapp.core.jobs import Job


def test_the_last_subscriber_leaving_cancels_a_job_unless_it_is_kept_running():
    left = Job("probe", "alice")
    events = left.subscribe(heartbeat=0.01)
    next(events)  # subscribed (a position or heartbeat)
    events.close()
    assert left.cancelled
    kept = Job("probe", "alice")
    events = kept.subscribe(heartbeat=0.01)
    next(events)
    kept.keep_running()
    events.close()
    assert not kept.cancelled


def test_a_shared_job_is_withdrawn_from_by_each_asker_in_turn():
    job = Job("probe", "alice")
    job.ask("bob")
    assert job.asked_by("alice") and job.asked_by("bob") and not job.asked_by("carol")
    assert job.withdraw("bob") is False  # alice still wants it
    assert not job.asked_by("bob")
    assert job.withdraw("carol") is False  # never asked: nothing changes
    assert job.withdraw("alice") is True  # nobody does now: the caller cancels it
