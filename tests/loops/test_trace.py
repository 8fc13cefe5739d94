"""Score semantics on constructed traces, and the streamed run on a scripted model."""

import time

import pytest

from tests.support.executors import FunctionJobs
from tests.support.loop_models import bundle
from webapp.core import InferenceCore, Job
from webapp.core.jobs import CANCELLED, DONE, FAILED
from webapp.loops.request import DemoRequest
from webapp.loops.task import SYMBOLS
from webapp.loops.trace import FLUSH_SECONDS, ModelRefused, TraceBuilder, check_model, run_trace, score_trace

CYCLE = [[s, SYMBOLS[(i + 1) % 26]] for i, s in enumerate(SYMBOLS)]


def request(steps, mapping=CYCLE, start="A"):
    return DemoRequest.parse({"mapping": mapping, "start": start, "steps": steps})


def rows_for(req, predictions):
    builder = TraceBuilder(req)
    for loop, p in enumerate(predictions, start=1):
        builder.add({"loop": loop, "prediction": p})
    return builder.rows


def test_exact_run_is_a_joint_success():
    req = request(3)
    summary = score_trace(req, rows_for(req, ["B", "C", "D"]), "head")
    assert summary == {"answer_correct": True, "complete_trajectory": True, "exact_stop": True,
                       "joint_success": True, "stop_reason": "head", "executed_loops": 3, "first_error": None,
                       "head_stop": None}  # these rows carry no stop probability


def test_a_forced_run_is_scored_where_its_head_would_have_stopped():
    req = request(3).with_options("6", "0.7")
    rows = rows_for(req, ["B", "C", "D", "E", "F", "G"])
    for row, p in zip(rows, (0.1, 0.6, 0.75, 0.9, 0.2, 0.1)):
        row["stop_probability"] = p
    summary = score_trace(req, rows, "forced")
    assert summary["head_stop"] == 3 and summary["exact_stop"] and summary["answer_correct"]  # at 0.7, not 0.5
    assert summary["executed_loops"] == 6 and summary["stop_reason"] == "forced"
    late = score_trace(request(2).with_options("6", "0.7"), rows_for(request(2), list("BCDEFG")), "forced")
    assert late["head_stop"] is None and not late["exact_stop"] and not late["answer_correct"]


def test_stopped_early():
    req = request(4)
    summary = score_trace(req, rows_for(req, ["B", "C"]), "head")
    assert summary["answer_correct"] is False and summary["complete_trajectory"] is False
    assert summary["exact_stop"] is False and summary["first_error"] is None  # no wrong row among those run


def test_stopped_late_keeps_trajectory_but_not_stop():
    req = request(2)
    rows = rows_for(req, ["B", "C", "D"])
    summary = score_trace(req, rows, "head")
    assert summary["complete_trajectory"] is True and summary["exact_stop"] is False
    assert summary["answer_correct"] is False  # the last prediction is x3, not x2
    assert rows[2]["expected"] == "D"  # the reference keeps advancing past k


def test_hit_the_cap():
    req = request(2)
    summary = score_trace(req, rows_for(req, ["B", "C"]), "cap")
    assert summary["answer_correct"] is True and summary["exact_stop"] is False
    assert summary["joint_success"] is False and summary["stop_reason"] == "cap"


def test_first_error_and_edge_validity():
    req = request(4)
    rows = rows_for(req, ["B", "X", "Y", "E"])
    assert [r["correct"] for r in rows] == [True, False, False, True]
    # X is wrong, but C→? no: B's destination is C, so B→X is not an edge; X→Y is a real edge
    assert [r["edge_valid"] for r in rows] == [True, False, True, False]
    assert score_trace(req, rows, "head")["first_error"] == 2


def test_answer_can_be_right_by_luck_on_a_short_cycle():
    two_cycle = [[s, "B" if s == "A" else "A"] for s in SYMBOLS]
    req = request(4, mapping=two_cycle)
    summary = score_trace(req, rows_for(req, ["B", "A", "B", "A", "B", "A"]), "head")
    # stopped two loops late, yet the last letter equals x4: answer_correct overstates skill
    assert summary["answer_correct"] is True and summary["complete_trajectory"] is True
    assert summary["exact_stop"] is False and summary["joint_success"] is False


def test_refuses_training_mode_and_missing_head():
    b = bundle()
    b.model.train()
    with pytest.raises(ModelRefused, match="Demo requires an eval-mode model with learned completion"):
        check_model(b.model)
    b.model.eval()
    b.model.completion_head = None
    with pytest.raises(ModelRefused):
        check_model(b.model)


@pytest.fixture
def core():
    core = InferenceCore({}, {"loops": FunctionJobs()})
    yield core
    core.shutdown()


def run_job(core, b, req):
    """-> (job, the rows events' row lists in order, the snapshot)."""
    holder = {}
    job = core.submit(Job("loops", "o", lambda job, c: holder.update(snapshot=run_trace(job, b, req))))
    batches = [e.data.rows for e in job.subscribe(0.05) if e is not None and e.name == "rows"]
    return job, batches, holder.get("snapshot")


def loops_of(batches):
    return [row["loop"] for rows in batches for row in rows]


def test_streamed_run_emits_every_loop_once_in_order_and_a_complete_snapshot(core):
    req = request(5)
    job, batches, snapshot = run_job(core, bundle(), req)
    assert job.state == DONE
    assert loops_of(batches) == [1, 2, 3, 4, 5]
    assert snapshot["trace"] == [row for rows in batches for row in rows]
    row = batches[0][0]
    assert set(row) == {"loop", "prediction", "direct_prediction", "stop_probability", "top3", "arrival_seconds",
                        "expected", "correct", "edge_valid"}
    assert len(row["top3"]) == 3 and row["top3"][0]["symbol"] == "B"
    assert snapshot["schema_version"] == 1 and snapshot["source"] == "live" and snapshot["status"] == "complete"
    assert snapshot["threshold"] == 0.5 and snapshot["safety_cap"] == 272
    assert snapshot["checkpoint"] == "test:scripted" and snapshot["request"] == req.payload()
    assert snapshot["summary"]["joint_success"] is True and snapshot["inference_seconds"] > 0


def test_fast_loops_share_events_but_the_first_loop_is_sent_at_once(core):
    job, batches, snapshot = run_job(core, bundle(stop_at=200), request(3))
    assert loops_of(batches) == list(range(1, 201))
    assert [row["loop"] for row in batches[0]] == [1]  # the viewer sees the run start without waiting
    assert len(batches) < 100  # a scripted loop takes microseconds: rows travel in batches


def test_slow_loops_are_sent_one_event_each(core):
    job, batches, snapshot = run_job(core, bundle(delay=FLUSH_SECONDS * 1.5), request(4))
    assert [[row["loop"] for row in rows] for rows in batches] == [[1], [2], [3], [4]]


def test_model_that_never_stops_hits_the_cap(core):
    job, batches, snapshot = run_job(core, bundle(stop_at=10_000), request(3))
    assert loops_of(batches) == list(range(1, 273)) and snapshot["summary"]["stop_reason"] == "cap"


@pytest.mark.parametrize("delay", [0.0, FLUSH_SECONDS * 1.5])
def test_nonfinite_output_fails_the_job_after_the_rows_before_it(core, delay):
    job, batches, snapshot = run_job(core, bundle(nan_at=3, delay=delay), request(5))
    assert job.state == FAILED and job.error == "Nonfinite model output"
    assert loops_of(batches) == [1, 2] and snapshot is None


def test_a_failing_model_keeps_the_rows_before_its_error(core):
    job, batches, snapshot = run_job(core, bundle(stop_at=10_000, raise_at=40), request(5))
    assert job.state == FAILED and "scripted failure" in job.error
    assert loops_of(batches) == list(range(1, 40))  # published even though the last batch never flushed


def test_outputs_are_read_as_they_were_when_reported(core):
    # a model that writes every loop into the same tensors, and has no direct readout at first
    job, batches, snapshot = run_job(core, bundle(stop_at=60, reuse_buffers=True, direct_from=30), request(5))
    rows = [row for rows in batches for row in rows]
    assert [r["prediction"] for r in rows] == [SYMBOLS[loop % 26] for loop in range(1, 61)]
    assert [r["direct_prediction"] is None for r in rows] == [loop < 30 for loop in range(1, 61)]
    assert all(r["correct"] for r in rows) and snapshot["summary"]["stop_reason"] == "head"


def test_cancel_keeps_every_row_worked_out_before_it(core):
    b = bundle(stop_at=10_000, delay=0.002)
    job = core.submit(Job("loops", "o", lambda job, c: run_trace(job, b, request(200))))
    stream = job.subscribe(0.05)
    next(e for e in stream if e is not None and e.name == "rows")  # loop 1, sent at once
    time.sleep(FLUSH_SECONDS / 2)  # a few loops later, before the next batch is due
    job.cancel()
    list(stream)
    assert job.state == CANCELLED
    rows = [row["loop"] for e in job.events if e.name == "rows" for row in e.data.rows]
    assert rows == list(range(1, b.model.loops_run))  # the loop that saw the cancel reported nothing


def test_cancel_stops_the_model_at_the_next_loop_and_frees_the_device(core):
    b = bundle(stop_at=10_000, delay=0.01)
    job = core.submit(Job("loops", "o", lambda job, c: run_trace(job, b, request(200))))
    stream = job.subscribe(0.05)
    next(e for e in stream if e is not None and e.name == "rows")
    stream.close()  # the only viewer left
    nxt = core.submit(Job("loops", "o", lambda job, c: None))
    list(nxt.subscribe(0.05))
    assert job.state == CANCELLED and nxt.state == DONE
    stopped_at = b.model.loops_run
    assert stopped_at < 100  # it stopped promptly, not at the cap
    assert b.model.loops_run == stopped_at  # and it is not still running behind the next job
