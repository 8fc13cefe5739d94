"""The core's queue, cancellation, replay and no-rerun behaviour, with whole jobs that are functions."""

import threading
import time

import pytest

from tests.conftest import wait_for
from tests.support.executors import FunctionJobs
from webapp.core import InferenceCore, Job, QueueFull, TooManyJobs
from webapp.core.jobs import CANCELLED, DONE, FAILED


def drain(job, heartbeat=0.05):
    """The runner's own events (not the core's position/running notices)."""
    return [e for e in job.subscribe(heartbeat) if e is not None and e.name not in ("position", "running")]


def counting_runner(n, delay=0.0, gate=None, calls=None):
    def run(job, core):
        if calls is not None:
            calls.append(job.id)
        if gate is not None:
            gate.wait(5)
        for i in range(n):
            job.emit("token", text=str(i))
            time.sleep(delay)
    return run


@pytest.fixture
def core():
    core = InferenceCore({}, {"t": FunctionJobs()})
    yield core
    core.shutdown(timeout=5)


def test_job_runs_and_subscriber_receives_every_event_then_end(core):
    job = core.submit(Job("t", "owner", counting_runner(5)))
    events = drain(job)
    assert [e.data["text"] for e in events if e.name == "token"] == ["0", "1", "2", "3", "4"]
    assert job.state == DONE
    assert core.counters["done"] == 1


def test_late_subscriber_gets_replay_and_finished_job_is_not_rerun(core):
    calls = []
    job = core.submit(Job("t", "owner", counting_runner(3, calls=calls)))
    first = drain(job)
    second = drain(job)  # opened after the job finished: replays, then ends
    assert [e.data for e in first if e.name == "token"] == [e.data for e in second if e.name == "token"]
    assert calls == [job.id]


def test_jobs_run_one_at_a_time_in_fifo_order_with_positions(core):
    gates, order = [threading.Event() for _ in range(3)], []

    def runner(tag):
        def run(job, core):
            order.append(tag)
            gates[tag].wait(5)
        return run

    jobs = [core.submit(Job("t", "o", runner(i))) for i in range(3)]
    assert wait_for(lambda: core.running_jobs() == [jobs[0]])
    assert [j.position for j in jobs] == [0, 1, 2]
    stream = jobs[2].subscribe(0.05)
    assert next(stream).data == {"position": 2}
    gates[0].set()
    assert wait_for(lambda: core.running_jobs() == [jobs[1]])
    assert next(e for e in stream if e is not None).data == {"position": 1}
    assert order == [0, 1]  # one at a time: job 2 has not started
    gates[1].set(), gates[2].set()
    assert [e.name for e in stream if e is not None] == ["running"]
    assert order == [0, 1, 2]


def test_last_subscriber_leaving_cancels_a_running_job_promptly(core):
    job = core.submit(Job("t", "o", counting_runner(10_000, delay=0.01)))
    stream = job.subscribe(0.05)
    next(e for e in stream if e is not None and e.name == "token")
    left = time.monotonic()
    stream.close()
    assert wait_for(lambda: job.state == CANCELLED, timeout=1.0)
    assert time.monotonic() - left < 1.0
    assert core.counters["cancelled"] == 1
    # the device is free: the next job runs
    after = core.submit(Job("t", "o", counting_runner(1)))
    assert [e.name for e in drain(after)] == ["token"]


def test_one_of_two_subscribers_leaving_does_not_cancel(core):
    gate = threading.Event()
    job = core.submit(Job("t", "o", counting_runner(2, gate=gate)))
    a, b = job.subscribe(0.05), job.subscribe(0.05)
    next(a), next(b)
    a.close()
    gate.set()
    assert [e.name for e in b if e is not None and e.name == "token"] == ["token", "token"]
    assert job.state == DONE


def test_cancelled_while_queued_never_runs_and_on_finish_is_called(core):
    gate, calls, finished = threading.Event(), [], []
    blocker = core.submit(Job("t", "o", counting_runner(0, gate=gate)))
    waiting = core.submit(Job("t", "o", counting_runner(1, calls=calls),
                              on_finish=lambda job, outcome, error: finished.append(outcome)))
    waiting.cancel()
    gate.set()
    assert wait_for(lambda: waiting.state == CANCELLED)
    assert calls == [] and finished == [CANCELLED]
    assert drain(blocker) == []


def test_a_result_whose_save_failed_is_saved_as_failed_once_the_disk_has_room(monkeypatch):
    monkeypatch.setattr("webapp.core.saves.SAVE_RETRY_SECONDS", 0.05)
    core = InferenceCore({}, {"t": FunctionJobs()}, keep_finished=1)
    disk_full, saved = threading.Event(), []
    disk_full.set()

    def save(job, outcome, error):
        if disk_full.is_set():
            raise OSError("database or disk is full")
        saved.append((outcome, error))

    try:
        job = core.submit(Job("t", "o", counting_runner(2), on_finish=save, ref="reply"))
        drain(job)
        assert job.state == FAILED and job.error == "Could not save the result: database or disk is full"
        for _ in range(3):  # more finished jobs than it keeps: the unsaved one is still found
            drain(core.submit(Job("t", "o", counting_runner(0))))
        time.sleep(0.2)  # several retries, all failing
        assert saved == [] and core.find("t", "reply") is job
        disk_full.clear()
        assert wait_for(lambda: saved)
        assert saved == [(FAILED, "Could not save the result: database or disk is full")]  # what the user was told
        drain(core.submit(Job("t", "o", counting_runner(0))))
        assert core.find("t", "reply") is None  # saved: forgotten like any finished job
    finally:
        core.shutdown(timeout=5)


def test_failure_is_reported_not_hidden(core):
    def broken(job, core):
        job.emit("token", text="a")
        raise FloatingPointError("Nonfinite model output")

    job = core.submit(Job("t", "o", broken))
    drain(job)
    assert job.state == FAILED and job.error == "Nonfinite model output"
    assert core.counters["failed"] == 1


def test_orphaned_job_is_cancelled(core):
    job = core.submit(Job("t", "o", counting_runner(10_000, delay=0.01), orphan_seconds=0.2))
    assert wait_for(lambda: job.state == CANCELLED, timeout=2.0)


def test_queue_limit_and_shutdown_cancel_everything():
    core = InferenceCore({}, {"t": FunctionJobs()}, max_queue=1)
    gate = threading.Event()
    running = core.submit(Job("t", "o", counting_runner(0, gate=gate)))
    assert wait_for(lambda: core.running_jobs() == [running])
    queued = core.submit(Job("t", "o", counting_runner(1)))
    with pytest.raises(QueueFull):
        core.submit(Job("t", "o", counting_runner(1)))
    gate.set()
    assert wait_for(lambda: running.state == DONE)
    core.shutdown(timeout=5)
    assert queued.state in (DONE, CANCELLED)


def test_jobs_per_owner_are_limited_even_when_submitted_at_once():
    core = InferenceCore({}, {"t": FunctionJobs()}, max_jobs_per_owner=2)
    gate, start = threading.Event(), threading.Barrier(8)
    accepted, refused = [], []

    def submit():
        start.wait()
        try:
            accepted.append(core.submit(Job("t", "o", counting_runner(0, gate=gate))))
        except TooManyJobs as error:
            refused.append(str(error))

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(accepted) == 2 and len(refused) == 6
    assert refused[0] == "You already have runs or replies waiting or running. Wait for one to finish or stop it."
    other = core.submit(Job("t", "someone else", counting_runner(0)))  # one browser's limit is its own
    gate.set()
    assert wait_for(lambda: all(j.state == DONE for j in accepted + [other]))
    assert core.submit(Job("t", "o", counting_runner(0)))  # finished jobs no longer count
    core.shutdown()


def test_the_jobs_of_a_group_count_as_one_against_the_limits():
    core = InferenceCore({}, {"t": FunctionJobs()}, max_jobs_per_owner=2, max_jobs_per_client=2)
    gate = threading.Event()
    sweep = [core.submit(Job("t", "o", counting_runner(0, gate=gate), client="1.2.3.4", group="s1"))
             for _ in range(5)]  # one sweep's runs: one job, however many
    mine = core.submit(Job("t", "o", counting_runner(0, gate=gate), client="1.2.3.4"))  # and one of the browser's
    with pytest.raises(TooManyJobs):  # now two: a third thing is refused, a new group's first run too
        core.submit(Job("t", "o", counting_runner(0, gate=gate), client="1.2.3.4", group="s2"))
    assert core.submit(Job("t", "o", counting_runner(0, gate=gate), client="1.2.3.4", group="s1"))
    gate.set()
    assert wait_for(lambda: all(j.state == DONE for j in sweep + [mine]))
    core.shutdown()


def test_shutdown_cancels_running_job_and_ends_streams():
    core = InferenceCore({}, {"t": FunctionJobs()})

    def forever(job, core):
        while True:
            job.emit("token", text="x")
            time.sleep(0.01)

    job = core.submit(Job("t", "o", forever))
    stream = job.subscribe(0.05)
    next(stream)
    core.shutdown(timeout=5)
    list(stream)  # ends: the job finished as cancelled
    assert job.state == CANCELLED


def test_warm_up_sets_ready():
    warmed = []
    core = InferenceCore({"m": object()}, warmups={"m": warmed.append})
    assert core.ready.wait(5)
    assert len(warmed) == 1
    core.shutdown()


# -- a long whole job and another address's short one (issue 52) ------------------------------------------
def test_another_addresss_short_job_runs_between_a_long_jobs_units():
    """A's job of 200 units of 10 ms calls interleave between them; B's short job, of another kind, submitted
    while A runs, ends long before A's, and A is not charged for B's time."""
    core = InferenceCore({}, {"long": FunctionJobs(), "short": FunctionJobs()})
    units, seen_by_b = [], []

    def long_run(job, core):
        for i in range(200):
            time.sleep(0.01)
            units.append(i)
            core.interleave()
            job.raise_if_cancelled()

    def short_run(job, core):
        seen_by_b.append(len(units))
        job.emit("token", text="b")
    try:
        a = core.submit(Job("long", "alice", long_run, client="10.0.0.1"))
        assert wait_for(lambda: len(units) >= 10, timeout=10)
        b = core.submit(Job("short", "bob", short_run, client="10.0.0.2"))
        drain(b)
        assert b.state == DONE and seen_by_b and seen_by_b[0] < 60, seen_by_b  # within a few of A's units
        assert not a.finished_state  # A goes on after it
        drain(a)
        assert a.state == DONE and units == list(range(200))
    finally:
        core.shutdown(timeout=5)


def test_the_same_address_or_the_same_kind_waits_for_the_running_job():
    """Beside a job runs only another client's job of another kind: an executor runs one job at a time,
    and one address's jobs take their turns."""
    core = InferenceCore({}, {"long": FunctionJobs(), "short": FunctionJobs()})
    done = threading.Event()
    order = []

    def long_run(job, core):
        while not done.is_set():
            time.sleep(0.01)
            core.interleave()
        order.append("long")

    def tag(name):
        def run(job, core):
            order.append(name)
        return run
    try:
        a = core.submit(Job("long", "alice", long_run, client="10.0.0.1"))
        assert wait_for(lambda: a.state == "running", timeout=10)
        same_address = core.submit(Job("short", "alice", tag("same address"), client="10.0.0.1"))
        same_kind = core.submit(Job("long", "bob", tag("same kind"), client="10.0.0.2"))
        time.sleep(0.3)  # time for the interleaves to (wrongly) run either
        assert order == []
        done.set()
        drain(same_address), drain(same_kind)
        assert order[0] == "long" and set(order[1:]) == {"same address", "same kind"}
    finally:
        core.shutdown(timeout=5)
