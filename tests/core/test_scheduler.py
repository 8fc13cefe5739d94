"""The step scheduler on plain data: fair order, positions per lane, admission given each batch's room,
which models step, and each step's prefill passes; and the worker carrying out its plan."""

import threading
import time

import pytest

from tests.conftest import wait_for
from tests.support.executors import FunctionJobs
from webapp.core import InferenceCore, Job
from webapp.core.executors import BatchedJobs, Finished, StepReport
from webapp.core.jobs import CANCELLED, DONE
from webapp.core.scheduler import BulkShare, Newcomer, Scheduler, prefill_pass


def job(kind: str, client: str) -> Job:
    return Job(kind, "owner", client=client)


def test_a_burst_from_one_client_does_not_push_anothers_first_job_behind_it():
    scheduler = Scheduler()
    burst = [job("chat", "a") for _ in range(3)]
    for j in burst:
        scheduler.add(j)
    other = job("chat", "b")
    scheduler.add(other)
    assert scheduler.fair_order() == [burst[0], other, burst[1], burst[2]]
    admitted, whole = scheduler.take({"chat": 1}, whole_too=True)
    assert admitted == [burst[0]] and whole is None
    assert scheduler.fair_order() == [other, burst[1], burst[2]]  # "a" was served last: "b" goes first
    assert len(scheduler) == 3


def test_positions_count_only_the_jobs_of_the_same_lane():
    scheduler = Scheduler()
    jobs = [job("chat", "a"), job("loops", "b"), job("chat:small", "c"), job("chat", "d"), job("loops", "e")]
    for j in jobs:
        scheduler.add(j)
    places = {j.id: place for j, place in scheduler.positions({"chat", "chat:small"})}
    assert [places[j.id] for j in jobs] == [1, 1, 1, 2, 2]


def test_admission_fills_each_batchs_room_and_takes_one_whole_job():
    scheduler = Scheduler()
    jobs = [job("chat", "a"), job("chat", "b"), job("loops", "c"), job("chat:small", "d"), job("loops", "e")]
    for j in jobs:
        scheduler.add(j)
    admitted, whole = scheduler.take({"chat": 1, "chat:small": 2}, whole_too=False)
    assert admitted == [jobs[0], jobs[3]] and whole is None  # no whole job while one is not wanted
    admitted, whole = scheduler.take({"chat": 0, "chat:small": 2}, whole_too=True)
    assert admitted == [] and whole is jobs[2]
    assert scheduler.waiting() == [jobs[1], jobs[4]]


def test_cancelled_waiting_jobs_are_dropped():
    scheduler = Scheduler()
    kept, gone = job("chat", "a"), job("chat", "b")
    scheduler.add(kept), scheduler.add(gone)
    gone.cancel()
    assert scheduler.drop_cancelled() == [gone] and scheduler.waiting() == [kept]


def test_every_model_with_rows_steps_once_a_turn_and_the_first_place_goes_round():
    scheduler = Scheduler()
    rows = {"chat": 2, "chat:b": 1, "chat:c": 0, "chat:d": 3}
    turns = [scheduler.to_step(rows) for _ in range(4)]
    assert turns == [["chat", "chat:b", "chat:d"], ["chat:b", "chat:d", "chat"], ["chat:d", "chat", "chat:b"],
                     ["chat", "chat:b", "chat:d"]]
    assert scheduler.to_step({"chat": 0, "chat:b": 0}) == []


def test_a_prefill_pass_stays_within_one_chunks_worth_while_rows_decode():
    rows = [Newcomer("old", 300, 128), Newcomer("half", 64, 128), Newcomer("whole", 128, 128),
            Newcomer("quarter", 32, 128)]
    assert prefill_pass(rows, others_decoding=True) == prefill_pass(rows[:1], True)  # the oldest fills it
    assert prefill_pass(rows, True).tokens == 128
    assert prefill_pass(rows[1:], True).rows == ("half", "quarter")  # the whole chunk behind them waits
    assert prefill_pass(rows, False).rows == ("old", "half", "whole", "quarter")  # nobody to stall: all
    assert prefill_pass(rows, False).tokens == 128 + 64 + 128 + 32
    # a second pass in the same step: only what still fits beside what the first one ran
    assert prefill_pass(rows[1:], True, used=64).rows == ("half",)
    assert prefill_pass(rows[2:], True, used=120).rows == ()
    assert prefill_pass([], True) == prefill_pass([], False)


class Rows(BatchedJobs):
    """A batched executor whose rows each need `steps` steps; it records the order it stepped in."""

    def __init__(self, name: str, log: list[str], steps: int = 3) -> None:
        self.name, self.log, self.steps, self.max_rows = name, log, steps, 4
        self._left: dict[str, tuple[Job, int]] = {}

    @property
    def rows(self) -> int:
        return len(self._left)

    def admit(self, job: Job) -> None:
        self._left[job.id] = (job, self.steps)

    def step(self, core) -> StepReport:
        self.log.append(self.name)
        report = StepReport(rows=len(self._left))
        for key, (j, left) in list(self._left.items()):
            if left == 1:
                del self._left[key]
                report.finished.append(Finished(j, DONE))
            else:
                self._left[key] = (j, left - 1)
        return report


def test_the_worker_steps_each_model_with_rows_in_turn():
    log: list[str] = []
    gate = threading.Event()
    core = InferenceCore({}, {"a": Rows("a", log), "b": Rows("b", log), "gate": FunctionJobs()})
    try:
        core.submit(Job("gate", "o", lambda job, core: gate.wait(5)))  # both replies are admitted in one turn
        jobs = [core.submit(Job("a", "o")), core.submit(Job("b", "o"))]
        gate.set()
        assert wait_for(lambda: all(j.state == DONE for j in jobs))
    finally:
        core.shutdown(timeout=5)
    assert log == ["a", "b", "b", "a", "a", "b"]  # each model once a turn; the first place goes round



# -- whole jobs' share of the worker ----------------------------------------------------------------


def test_bulk_share_owes_running_replies_the_rest_of_the_time():
    half = BulkShare(0.5)
    half.ran_whole(0.1, replies_waiting=True)
    assert half.due and abs(half.owed - 0.1) < 1e-12
    half.stepped(0.04)
    assert half.due and abs(half.owed - 0.06) < 1e-12
    half.ran_whole(1.0, replies_waiting=False)  # nobody to wait: nothing owed for it
    assert abs(half.owed - 0.06) < 1e-12
    half.stepped(1.0)
    assert not half.due and half.owed == 0.0
    quarter = BulkShare(0.25)
    quarter.ran_whole(0.1, replies_waiting=True)
    assert abs(quarter.owed - 0.3) < 1e-12  # whole jobs a quarter of the time: three times as long owed
    quarter.settle()
    assert not quarter.due


def test_bulk_time_spent_off_the_worker_is_owed_back_with_the_next_whole_job_s():
    half = BulkShare(0.5)
    threads = [threading.Thread(target=lambda: [half.ran_elsewhere(0.001) for _ in range(100)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not half.due  # taken in by the worker, at its next whole job's slice
    half.ran_whole(0.1, replies_waiting=True)
    assert abs(half.owed - 0.5) < 1e-9  # 0.1 on the worker, 0.4 from four request threads
    half.ran_whole(0.1, replies_waiting=True)
    assert abs(half.owed - 0.6) < 1e-9  # taken in once


def test_the_next_whole_job_is_the_one_of_the_client_that_had_the_least_whole_job_time():
    scheduler = Scheduler()
    a1, a2, b1, b2 = job("whole", "a"), job("whole", "a"), job("whole", "b"), job("whole", "b")
    for j in (a1, a2, b1):
        scheduler.add(j)
    assert scheduler.take({}, whole_too=True) == ([], a1)
    scheduler.charge(a1, 1.0)  # a long run
    assert scheduler.take({}, whole_too=True) == ([], b1)
    scheduler.charge(b1, 0.1)  # a short one
    scheduler.add(b2)
    # round-robin alone would take a2 now (b was served last); b has had a tenth of a's time
    assert scheduler.take({}, whole_too=True) == ([], b2)
    scheduler.charge(b2, 0.1)
    assert scheduler.take({}, whole_too=True) == ([], a2)


def test_a_client_new_to_whole_jobs_banks_no_time_it_was_not_there_for():
    scheduler = Scheduler()
    for _ in range(5):
        for client in "ab":
            scheduler.add(job("whole", client))
            _, taken = scheduler.take({}, whole_too=True)
            scheduler.charge(taken, 1.0)
    late = [job("whole", "c") for _ in range(3)]
    for j in late:
        scheduler.add(j)
    a, b = job("whole", "a"), job("whole", "b")
    scheduler.add(a)
    scheduler.add(b)
    order = []
    for _ in range(5):
        _, taken = scheduler.take({}, whole_too=True)
        scheduler.charge(taken, 1.0)
        order.append(taken)
    # c starts level with the others, not five seconds behind them: it does not run all its jobs first
    assert order.index(a) < order.index(late[2]) and order.index(b) < order.index(late[2])


class Spinning(Rows):
    """Rows whose every step keeps the worker busy for `seconds`; it adds up the time it stepped."""

    def __init__(self, seconds: float) -> None:
        super().__init__("spin", [], steps=10**6)
        self.seconds, self.stepped = seconds, 0.0

    def step(self, core) -> StepReport:
        started = time.perf_counter()
        spin(self.seconds)
        self.stepped += time.perf_counter() - started
        report = super().step(core)
        for key, (j, _) in list(self._left.items()):
            if j.cancelled:
                del self._left[key]
                report.finished.append(Finished(j, CANCELLED))
        return report


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.parametrize("interleaving", [True, False], ids=["long jobs that interleave", "a flood of short jobs"])
def test_whole_jobs_take_no_more_than_their_share_of_the_worker_from_running_replies(interleaving, share=0.5):
    batch = Spinning(0.002)
    spun = []

    def whole(job, core):
        for _ in range(30 if interleaving else 1):
            started = time.perf_counter()
            spin(0.01)
            spun.append(time.perf_counter() - started)  # the whole job's own work
            if interleaving:
                core.interleave()

    core = InferenceCore({}, {"chat": batch, "bulk": FunctionJobs()}, bulk_share=share, max_queue=1000)
    try:
        reply = core.submit(Job("chat", "good", client="good"))
        assert wait_for(lambda: batch.stepped > 0)
        flood = range(4 if interleaving else 40)
        jobs = [core.submit(Job("bulk", f"o{i}", whole, client=f"flood{i % 4}")) for i in flood]
        assert wait_for(lambda: all(j.state == DONE for j in jobs), timeout=60)
        stepped = batch.stepped
        reply.cancel()
        assert wait_for(lambda: reply.state == CANCELLED)
    finally:
        core.shutdown(timeout=5)
    # the replies stepped at least about as long as the whole jobs worked (half the time each): without
    # the share they got one 2 ms step per 50 ms slice, or one per short job
    assert stepped >= 0.7 * sum(spun), (stepped, sum(spun))


class BulkSpinning(Spinning):
    """Spinning rows that are bulk work (as Loop-lab runs stepped together are)."""

    bulk = True


def test_a_bulk_batch_takes_no_more_than_its_share_of_the_worker_from_running_replies():
    replies, flood = Spinning(0.002), BulkSpinning(0.01)
    core = InferenceCore({}, {"chat": replies, "runs": flood}, bulk_share=0.5, max_queue=1000)
    try:
        reply = core.submit(Job("chat", "good", client="good"))
        assert wait_for(lambda: replies.stepped > 0)
        before = replies.stepped
        runs = [core.submit(Job("runs", f"o{i}", client=f"flood{i}")) for i in range(4)]
        assert wait_for(lambda: flood.stepped >= 0.3, timeout=30)
        bulk, stepped = flood.stepped, replies.stepped - before
        for job in [reply, *runs]:
            job.cancel()
        assert wait_for(lambda: all(j.state == CANCELLED for j in [reply, *runs]))
    finally:
        core.shutdown(timeout=5)
    # stepped in turn, a 2 ms reply step would get one 10 ms bulk step beside it: a sixth of the time
    assert stepped >= 0.7 * bulk, (stepped, bulk)
