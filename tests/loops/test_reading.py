"""Which rule each loop read: the bundled model's loop attention, summed per rule, in the trace rows."""

import random

import pytest
import torch

from tests.support.executors import FunctionJobs
from tests.support.loop_models import bundle as scripted_bundle
from webapp.core import InferenceCore, Job
from webapp.loops.model.checkpoint import load_bundle
from webapp.loops.reading import read_rules, rule_matrix, supports_attention
from webapp.loops.request import DemoRequest
from webapp.loops.task import PROMPT_LENGTH, SYMBOLS, preset, render_prompt
from webapp.loops.trace import run_trace

ROW_KEYS = {"loop", "prediction", "direct_prediction", "stop_probability", "top3", "arrival_seconds",
            "expected", "correct", "edge_valid"}


@pytest.fixture(scope="module")
def core():
    core = InferenceCore({}, {"loops": FunctionJobs()})
    yield core
    core.shutdown()


def trace(core, bundle, req):
    holder = {}
    job = core.submit(Job("loops", "o", lambda job, c: holder.update(snapshot=run_trace(job, bundle, req))))
    list(job.subscribe(0.05))
    return holder["snapshot"]


def cycle_request(steps=12, seed=7):
    return DemoRequest.parse({"mapping": preset("cycle", random.Random(seed)), "start": "A", "steps": steps})


def test_each_rule_owns_its_source_and_destination_characters():
    pairs = preset("function", random.Random(3))
    prompt = render_prompt(pairs, "B", 5)
    matrix = rule_matrix(pairs)
    assert matrix.shape == (PROMPT_LENGTH, 26) and matrix.sum() == 52
    for r, (source, destination) in enumerate(pairs):
        owned = matrix[:, r].nonzero().flatten().tolist()
        assert [prompt[i] for i in owned] == [source, destination]


def test_the_read_rule_is_the_one_with_most_mass_heads_combined():
    pairs = [[s, SYMBOLS[(i + 1) % 26]] for i, s in enumerate(SYMBOLS)]
    attention = torch.zeros(1, 2, PROMPT_LENGTH)
    attention[0, 0, 3 * 5] = 1.0                       # head 0 all on F's source
    attention[0, 1, 3 * 5 + 1] = 0.6                   # head 1 on F's destination, and on
    attention[0, 1, 3 * 9] = 0.4                       # J's source
    assert read_rules(pairs, attention) == [{"source": "F", "destination": "G", "mass": 0.8}]


def test_bundled_model_reads_the_rule_of_the_letter_it_is_on(core):
    b = load_bundle()
    assert supports_attention(b.model)
    req = cycle_request(steps=12)
    snapshot = trace(core, b, req)
    rows = snapshot["trace"]
    on = [req.start] + [row["prediction"] for row in rows[:-1]]   # the letter each loop started from
    hits = sum(row["read"]["source"] == letter for row, letter in zip(rows, on))
    assert hits >= 0.9 * len(rows)
    for row in rows:
        assert set(row) == ROW_KEYS | {"read", "attention", "state_change", "distance_to_last", "pca"}
        assert row["read"]["destination"] == req.mapping[row["read"]["source"]]
        assert 0 < row["read"]["mass"] <= 1
        assert len(row["attention"]) == b.model.config.n_head
        for head in row["attention"]:
            assert len(head) == PROMPT_LENGTH and sum(head) == pytest.approx(1, abs=1e-3)


def test_a_model_without_the_block_gets_plain_rows(core):
    model = scripted_bundle()
    assert not supports_attention(model.model)
    snapshot = trace(core, model, cycle_request(steps=3))
    assert all(set(row) == ROW_KEYS for row in snapshot["trace"])
