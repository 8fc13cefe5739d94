"""Issue 32 item 5: an owner's loop models (the factory contract: predictions and a stop head, no attention,
no direct readout, no config) get every view whose inputs they provide — a trace, a sweep, a comparison —
and "not available for this model" for the rest (where the loop looked)."""

import json

import pytest

from tests.conftest import csrf_of, make_app, sse_events
from tests.support.loop_models import bundle
from webapp.loops.reading import NOT_AVAILABLE
from webapp.loops.task import SYMBOLS
from webapp.web.state import glassbox

CYCLE = [[s, SYMBOLS[(i + 1) % 26]] for i, s in enumerate(SYMBOLS)]


@pytest.fixture
def owner_app(tmp_path, monkeypatch):
    """The owner's scripted model (no direct readout at any loop), and its early one (wrong from loop 4)."""
    monkeypatch.setenv("GLASSBOX_LOOP_EXTRA_MODELS", "early=tests.loops.early_model:load")
    app = make_app(tmp_path, {"loops": bundle(direct_from=10**6)})
    yield app
    glassbox(app).core.shutdown()


def test_an_owner_model_gets_traces_sweeps_and_comparisons(owner_app):
    client = owner_app.test_client()
    csrf = csrf_of(client, "/loops/")
    lines = [json.loads(line) for line in client.post("/api/loops/sweep", json={
        "model": ["main", "early"], "family": "permutation", "k": [2, 6], "tables": 2, "seed": 4}).get_data(
        as_text=True).splitlines() if line.strip()]
    by = {(line["model"], line["k"]): line for line in lines[:-1]}
    assert by[("main", 6)]["joint_success"] == 1.0 and by[("main", 6)]["first_errors"] == {}
    assert by[("early", 2)]["joint_success"] == 1.0
    assert by[("early", 6)]["first_errors"] == {"4": 2} and by[("early", 6)]["answer_correct"] == 0.0
    saved = lines[-1]["sweep_id"]
    page = client.get(f"/loops/sweeps/{saved}").get_data(as_text=True)
    assert page.count("<svg") == 5 and "Tables on which they disagree (2)" in page
    # a trace: every view but where the loop looked, which says it is not available
    data = {"csrf_token": csrf, "start": "A", "steps": "6", "src": [s for s, _ in CYCLE],
            "dst": [d for _, d in CYCLE], "model": "main"}
    trace_id = client.post("/loops/run", data=data).headers["Location"].rsplit("/", 1)[-1]
    trace = client.get(f"/loops/traces/{trace_id}").get_data(as_text=True)
    assert NOT_AVAILABLE in trace and 'id="player"' in trace and "Compare with" in trace
    compared = client.post(f"/loops/traces/{trace_id}/compare", data={"csrf_token": csrf, "model": "early"})
    page = client.get(compared.headers["Location"]).get_data(as_text=True)
    assert "They first differ at" in page and "loop 4" in page


def test_a_live_sweep_page_of_an_owner_model_streams_its_lines(owner_app):
    client = owner_app.test_client()
    csrf = csrf_of(client, "/loops/")
    started = client.post("/loops/sweeps", data={"csrf_token": csrf, "model": "early", "compare": "",
                                                 "family": "cycle", "k": "1-5", "tables": "1", "seed": "9"})
    job_id = started.headers["Location"].rsplit("/", 1)[-1]
    events = sse_events(client.get(f"/loops/sweeps/live/{job_id}/stream").get_data(as_text=True))
    assert [name for name, _ in events].count("line") == 5 and events[-1][0] == "done"
    assert "first wrong loop" in events[-1][1] and "Tables on which they disagree" not in events[-1][1]
