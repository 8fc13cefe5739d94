"""Loop-lab runs stepped together: each run's trace is the run alone, row for row, bit for bit at fp32."""

from __future__ import annotations

import random

import pytest
import torch

from tests.conftest import wait_for
from tests.support.loop_models import bundle as scripted_bundle
from webapp.core import InferenceCore, Job
from webapp.core.jobs import CANCELLED, DONE
from webapp.loops import boot
from webapp.loops.batch import LoopBatch
from webapp.loops.model.checkpoint import load_bundle
from webapp.loops.request import DemoRequest
from webapp.loops.runs import BATCHED, LoopResult, LoopRuns
from webapp.loops.service import LoopService
from webapp.loops.task import SYMBOLS


@pytest.fixture(scope="module")
def bundled():
    return load_bundle()


@pytest.fixture(scope="module")
def early():
    return load_bundle(boot.EARLY_BUNDLE)


def table(seed: int, steps: int, start: str | None = None) -> DemoRequest:
    rng = random.Random(seed)
    sources = list(SYMBOLS)
    rng.shuffle(sources)  # the rules' order is part of the prompt
    mapping = [[s, rng.choice(SYMBOLS)] for s in sources]
    return DemoRequest.parse({"mapping": mapping, "start": start or rng.choice(SYMBOLS), "steps": steps})


def requests() -> list[DemoRequest]:
    """Tables unlike each other: k from 1 to 256, random functions and a 26-cycle, several starts."""
    cycle = [[s, SYMBOLS[(i + 1) % 26]] for i, s in enumerate(SYMBOLS)]
    reqs = [table(seed, k) for seed, k in enumerate((1, 2, 7, 30, 99, 130, 256))]
    reqs.append(DemoRequest.parse({"mapping": cycle, "start": "C", "steps": 64}))
    return reqs


def core_for(runs: LoopRuns) -> InferenceCore:
    return InferenceCore({"loops": runs.bundle}, {"loops": runs, BATCHED: LoopBatch(runs)})


def drain(job):
    return [e for e in job.subscribe(0.05) if e is not None]


def run_jobs(runs: LoopRuns, reqs, kind=BATCHED, together=True, sizes=None):
    """Run the requests through a real core: all submitted at once (together), else one after another."""
    core = core_for(runs)
    model = runs.bundle.model
    step = model.step
    if sizes is not None:
        model.step = lambda rows, *a: sizes.append(rows.loops.size(0)) or step(rows, *a)
    try:
        jobs = []
        for i, req in enumerate(reqs):
            job = core.submit(Job(kind, f"user{i}", req, result=LoopResult()))
            jobs.append(job)
            if not together:
                drain(job)
        for job in jobs:
            drain(job)
    finally:
        core.shutdown()
        if sizes is not None:
            del model.step
    return jobs


def without_time(rows):
    return [{k: v for k, v in row.items() if k != "arrival_seconds"} for row in rows]


def streamed(job):
    return [row for e in job.events if e.name == "rows" for row in e.data.rows]


@pytest.mark.parametrize("which", ["bundled", "early"])
def test_a_run_batched_is_the_run_alone_bit_for_bit(which, request):
    loaded = request.getfixturevalue(which)
    runs = LoopRuns(loaded)
    reqs = requests()
    whole = run_jobs(runs, reqs, kind="loops", together=False)  # the model's own forward, one at a time
    alone = run_jobs(runs, reqs, together=False)               # the batch, one run in it at a time
    sizes: list[int] = []
    batched = run_jobs(runs, reqs, sizes=sizes)
    assert max(sizes) >= 6, sizes  # they really stepped together, joining and leaving
    assert len(set(sizes)) >= 2, sizes
    for w, a, b in zip(whole, alone, batched):
        assert w.state == a.state == b.state == DONE, (w.error, a.error, b.error)
        rows = without_time(w.result.snapshot["trace"])
        assert len(rows) >= 1 and all("state_change" in row for row in rows)
        assert without_time(a.result.snapshot["trace"]) == rows
        assert without_time(b.result.snapshot["trace"]) == rows  # every row, every float, exactly
        assert without_time(streamed(b)) == rows  # the live rows are the saved ones
        for key in ("summary", "request", "checkpoint", "status"):
            assert a.result.snapshot[key] == b.result.snapshot[key] == w.result.snapshot[key], key
    # the trained model stops on its head at k; the early one does not always: both kinds of ending ran
    reasons = {b.result.snapshot["summary"]["stop_reason"] for b in batched}
    assert "head" in reasons


def test_a_stopped_run_leaves_the_batch_and_the_others_run_on(bundled):
    runs = LoopRuns(bundled)
    reqs = [table(50 + i, 256) for i in range(4)]
    alone = run_jobs(runs, reqs[1:], together=False)
    core = core_for(runs)
    try:
        jobs = [core.submit(Job(BATCHED, f"user{i}", req, result=LoopResult())) for i, req in enumerate(reqs)]
        assert wait_for(lambda: len(streamed(jobs[0])) >= 3)
        jobs[0].cancel()
        for job in jobs:
            drain(job)
    finally:
        core.shutdown()
    assert jobs[0].state == CANCELLED and jobs[0].result.snapshot is None
    assert 3 <= len(streamed(jobs[0])) < 256  # the rows it ran are still shown
    for job, one in zip(jobs[1:], alone):
        assert job.state == DONE
        assert without_time(job.result.snapshot["trace"]) == without_time(one.result.snapshot["trace"])


def test_an_owner_model_that_cannot_batch_runs_alone(bundled, tmp_path):
    owner = scripted_bundle()  # the owner's contract only: no start()/step()
    runs = LoopRuns(owner)
    assert boot.batch_executor(runs) is None  # nothing to batch: every run is alone
    mixed = LoopRuns(bundled, extra={"owner": owner})
    batch = boot.batch_executor(mixed)
    assert batch is not None and batch.steps("main") and not batch.steps("owner")
    core = InferenceCore({"loops": bundled}, {"loops": mixed, BATCHED: batch})
    try:
        service = LoopService(core, store=None)  # type: ignore[arg-type]
        main = table(7, 5)
        theirs = DemoRequest(main.pairs, main.start, main.steps, model="owner")
        assert service.kind(main) == BATCHED and service.kind(theirs) == "loops"
        job = core.submit(Job(service.kind(theirs), "u", theirs, result=LoopResult()))
        drain(job)
    finally:
        core.shutdown()
    assert job.state == DONE and job.result.snapshot["summary"]["executed_loops"] == 5
    assert owner.model.loops_run == 5
    assert all("state_change" not in row for row in job.result.snapshot["trace"])  # not available


def test_state_change_is_the_relative_norm_of_the_block_output_change(bundled):
    # A plain nanoGPT-style reference of the loop, by hand: h_t is the loop block's output at the query.
    model, req = bundled.model, table(3, 12)
    tok = bundled.tokenizer(bundled.render_prompt(list(req.pairs), req.start, req.steps),
                            add_special_tokens=False, return_tensors="pt")
    ids = torch.tensor(list(bundled.readout_token_ids))
    seen = []
    with torch.inference_mode():
        model(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"], num_loops=12,
              completion_threshold=1.01, readout_token_ids=list(ids), loop_state_change=True,
              loop_callback=lambda loop, s, stop, state, state_change: seen.append(float(state_change[0])))
        kv, mask, slots = model.encode(tok["input_ids"], tok["attention_mask"])
        w = model.wte.weight[ids].t() / model.config.n_embd ** 0.5
        letter = (model.ln_f(slots[:, 0]) @ w).argmax(-1)
        block, previous, expected = model.loop_block, None, []
        for _ in range(12):
            z = model.wte(ids[letter]).unsqueeze(1)
            x = block.ln_1(z)
            q = block.attn.split(block.attn.q_proj(x))
            att = (q @ kv[0].transpose(-2, -1) / q.size(-1) ** 0.5).softmax(-1)
            a = block.attn.c_proj((att @ kv[1]).transpose(1, 2).reshape(1, 1, -1))
            h = (a + block.mlp(block.ln_2(a)))[0, 0].double()
            expected.append(None if previous is None else float((h - previous).norm() / previous.norm()))
            previous = h
            letter = (model.ln_f(h.float()) @ w).argmax(-1, keepdim=True)
    assert seen[0] != seen[0]  # NaN: no previous state at loop 1
    assert seen[1:] == pytest.approx(expected[1:], rel=1e-4, abs=1e-6)
    assert max(seen[1:]) > 0


def test_lanes_of_a_few_rows_each_loop_in_turn_and_change_nothing(bundled, monkeypatch):
    runs = LoopRuns(bundled)
    reqs = requests()[:6]
    alone = run_jobs(runs, reqs, together=False)
    monkeypatch.setattr("webapp.loops.batch.LANE_ROWS", 2)  # three lanes of two runs
    sizes: list[int] = []
    lanes = run_jobs(runs, reqs, sizes=sizes)
    assert max(sizes) == 2
    for a, b in zip(alone, lanes):
        assert b.state == DONE
        assert without_time(b.result.snapshot["trace"]) == without_time(a.result.snapshot["trace"])


class StubWorker:
    """The core as LoopBatch sees it, with other work waiting or not."""

    def __init__(self, others: bool) -> None:
        self.others = others

    def count(self, name, n=1, job=None) -> None:
        pass

    def interleave(self) -> None:
        pass

    def others_waiting(self, executor) -> bool:
        return self.others


@pytest.mark.parametrize("others, read", [(False, 6), (True, 1)])
def test_a_step_reads_one_prompt_when_other_work_waits(bundled, monkeypatch, others, read):
    from webapp.loops import batch as loop_batch
    monkeypatch.setattr(loop_batch, "START_SECONDS", 60.0)        # alone: every waiting prompt in one step
    monkeypatch.setattr(loop_batch, "SHARED_START_SECONDS", 0.0)  # others waiting: the one prompt a step must read
    executor = LoopBatch(LoopRuns(bundled))
    for i, req in enumerate(requests()[1:7]):  # k of 2 and more: none ends in this step
        executor.admit(Job(BATCHED, f"user{i}", req, result=LoopResult()))
    executor.step(StubWorker(others))
    assert sum(row.group is not None for row in executor._rows.values()) == read


def test_a_model_whose_step_keeps_its_state_to_itself_still_runs_and_a_failing_run_fails_alone(bundled, monkeypatch):
    from dataclasses import replace as replaced

    from webapp.loops import batch as loop_batch
    step = bundled.model.step

    def without_state(rows, *args):  # an owner's step() written before LoopStep had a state
        out, after = step(rows, *args)
        return replaced(out, state=None), after
    monkeypatch.setattr(bundled.model, "step", without_state)
    reqs = [table(70 + i, 5) for i in range(3)]
    complete = loop_batch.complete

    def scoring(request, *args, **kwargs):  # scoring one run fails; the others end as usual
        if request is reqs[1]:
            raise RuntimeError("scoring broke")
        return complete(request, *args, **kwargs)
    monkeypatch.setattr(loop_batch, "complete", scoring)
    jobs = run_jobs(LoopRuns(bundled), reqs)
    assert [j.state for j in jobs] == [DONE, "failed", DONE] and jobs[1].error == "scoring broke"
    rows = jobs[0].result.snapshot["trace"]
    assert len(rows) == 5 and "pca" not in rows[0] and jobs[0].result.snapshot["analyses"]["has_state"] is False
