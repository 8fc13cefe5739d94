"""The latent-state model in the Loop lab: listed with its trained k, run past its head and its training
(?force_loops=, ?threshold=), its state's measures in the API (?analyses=) and on the trace page, and a
plain "needs the model's state" for a model that does not hand it over."""

from __future__ import annotations

import json
import math
import re

import pytest

from tests.conftest import csrf_of, make_app
from tests.loops.web.test_lab import CYCLE, form, run_live
from tests.support.loop_models import bundle as scripted_bundle
from webapp.loops.model.checkpoint import load_bundle
from webapp.loops.task import SYMBOLS
from webapp.web.state import glassbox

# A table with a 3-cycle inside: C -> D -> E -> C, everything else to C.
SMALL_CYCLE = [[s, {"C": "D", "D": "E", "E": "C"}.get(s, "C")] for s in SYMBOLS]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    app = make_app(tmp_path_factory.mktemp("state"), {"loops": load_bundle()})
    yield app
    glassbox(app).core.shutdown()


def lines_of(response) -> list[dict]:
    return [json.loads(line) for line in response.get_data(as_text=True).splitlines() if line.strip()]


def test_the_models_are_listed_with_whether_they_carry_state_and_their_trained_k(app):
    models = app.test_client().get("/api/loops/models").get_json()
    by_name = {m["name"]: m for m in models}
    assert [m["name"] for m in models][:2] == ["main", "early"]
    assert by_name["latent"]["carries_state"] is True and by_name["main"]["carries_state"] is False
    assert by_name["latent"]["trained_k"] == [1, 32] and by_name["main"]["trained_k"] == [1, 256]
    assert by_name["latent-early"]["trained_k"][1] < 32
    assert all(m["checkpoint"].startswith("bundled:") for m in models)
    page = app.test_client().get("/loops/").get_data(as_text=True)
    assert "To watch a state that moves from loop to loop, pick\n      <strong>Latent state" in page


def test_a_forced_run_on_the_latent_model_with_the_states_measures(app):
    body = {"mapping": SMALL_CYCLE, "start": "A", "steps": 5}
    lines = lines_of(app.test_client().post("/api/loops/trace?model=latent&force_loops=300&analyses=state",
                                            json=body))
    rows, final = lines[:-1], lines[-1]
    assert [r["loop"] for r in rows] == list(range(1, 301))  # every forced loop, past k and past training
    assert final["status"] == "complete" and final["force_loops"] == 300 and "trace" not in final
    assert final["summary"]["stop_reason"] == "forced" and final["summary"]["head_stop"] == 5
    assert final["summary"]["joint_success"] is True
    for row in rows:
        assert set(row) >= {"state_change", "distance_to_last", "pca"} and "attention_entropy" not in row
    assert rows[0]["state_change"] is None and rows[-1]["distance_to_last"] == 0
    # On the 3-cycle the state comes back to where it was three loops before: far from the last loop's
    # state two loops out of three, at it every third.
    tail = [r["distance_to_last"] for r in rows[-9:]]
    assert [d < 1e-3 for d in tail] == [False, False, True] * 3
    assert all(math.isfinite(v) for r in rows for v in r["pca"])


def test_snapshots_and_the_attention_measures_come_on_request_too(app):
    body = {"mapping": CYCLE, "start": "B", "steps": 4}
    final = lines_of(app.test_client().post("/api/loops/trace?stream=snapshots&analyses=state,attention",
                                            json=body))[-1]
    rows = final["trace"]
    assert len(rows) == 4 and all({"pca", "attention_entropy", "attention_shift"} <= set(row) for row in rows)
    assert rows[0]["attention_shift"] is None and 0 <= rows[1]["attention_entropy"] <= math.log(88)
    assert "attention_settles_at" in final["analyses"]


def test_another_threshold_is_echoed_and_decides_where_the_head_stops(app):
    body = {"mapping": CYCLE, "start": "A", "steps": 7}
    lines = lines_of(app.test_client().post("/api/loops/trace?threshold=0.999&force_loops=12", json=body))
    final = lines[-1]
    assert final["threshold"] == 0.999
    first = next((r["loop"] for r in lines[:-1] if r["stop_probability"] >= 0.999), None)
    assert final["summary"]["head_stop"] == first


@pytest.mark.parametrize("query, message", [
    ("force_loops=0", "force_loops must be an integer from 1 to 999"),
    ("force_loops=1000", "force_loops must be an integer from 1 to 999"),
    ("force_loops=2.5", "force_loops must be an integer from 1 to 999"),
    ("force_loops=", "force_loops must be an integer from 1 to 999"),
    ("threshold=0", "threshold must be a number greater than 0 and less than 1"),
    ("threshold=1", "threshold must be a number greater than 0 and less than 1"),
    ("threshold=nan", "threshold must be a number greater than 0 and less than 1"),
    ("threshold=half", "threshold must be a number greater than 0 and less than 1"),
    ("analyses=everything", "analyses must be state, attention or state,attention"),
    ("analyses=", "analyses must be state, attention or state,attention"),
])
def test_bad_options_get_the_exact_message(app, query, message):
    response = app.test_client().post(f"/api/loops/trace?{query}",
                                      json={"mapping": CYCLE, "start": "A", "steps": 3})
    assert response.status_code == 400 and response.get_json() == {"error": message}


def test_the_body_keeps_the_owners_messages_first(app):
    response = app.test_client().post("/api/loops/trace?force_loops=5000", json={"mapping": [], "start": "A",
                                                                                   "steps": 3})
    assert response.get_json() == {"error": "Supply all 26 A–Z rules, with one destination per node"}


def test_the_page_runs_past_training_and_draws_the_states_path(app):
    client = app.test_client()
    final = run_live(client, csrf_of(client, "/loops/"), steps="6", mapping=SMALL_CYCLE, model="latent",
                     force_loops="40")[-1][1]
    assert "forced to run 40 loops; its head would have stopped it at loop 6" in final
    section = final[final.index('id="state-view"'):]
    path = section[section.index('id="trajectory"'):].split("</figure>")[0]
    assert path.count('class="dot') == 40 and "stopped" in path and "carried from loop to loop" in path
    assert re.search(r"40 loops, [0-9]+ distinct places", path)
    assert 'id="attention-entropy"' in section and "k−1 <small" in section


def test_bad_options_on_the_page_say_which_field(app):
    client = app.test_client()
    csrf = csrf_of(client, "/loops/")
    response = client.post("/loops/run", data=form(csrf, force_loops="5000"), headers={"HX-Request": "true"})
    page = response.get_data(as_text=True)
    assert response.status_code == 400 and 'id="force-error"' in page
    assert "force_loops must be an integer from 1 to 999" in page and 'value="5000"' in page  # kept, not lost
    response = client.post("/loops/run", data=form(csrf, threshold="2"), headers={"HX-Request": "true"})
    assert 'id="threshold-error"' in response.get_data(as_text=True)


def test_a_model_that_keeps_its_state_to_itself_says_so(tmp_path):
    app = make_app(tmp_path, {"loops": scripted_bundle()})
    try:
        client = app.test_client()
        final = run_live(client, csrf_of(client, "/loops/"), steps="3")[-1][1]
        path = final[final.index('id="trajectory"'):].split("</figure>")[0]
        assert "needs the model&#39;s state" in path and "<svg" not in path
        models = client.get("/api/loops/models").get_json()
        assert models[0]["carries_state"] is False and models[0]["gives_state"] is False
    finally:
        glassbox(app).core.shutdown()


def test_a_sweep_trains_a_probe_on_its_states_and_its_page_shows_it(app):
    client = app.test_client()
    client.get("/loops/")  # a browser's cookie: the sweep is saved with its traces
    lines = lines_of(client.post("/api/loops/sweep", json={"model": ["latent", "main"], "family": "function",
                                                            "k": [3, 12, 40], "tables": 8, "seed": 5}))
    final = lines[-1]
    assert final["status"] == "complete"
    probe = final["probe"]["latent"]
    assert probe["buckets"] == ["1–8", "9–32", "33–64", "65–128", "129–256"] and probe["train"] > 0
    rows = {row["back"]: row for row in probe["rows"]}
    assert rows[None]["accuracy"][0] == 1.0  # its own readout, every row of the sweep's runs
    assert rows[0]["accuracy"][0] >= 0.8 and rows[0]["n"][0] > 0  # held out: odd tables only
    assert rows[0]["accuracy"][1] > rows[2]["accuracy"][1]  # the letter it is on, better than two hops back
    assert rows[0]["accuracy"][3] is None  # no run went past loop 40
    assert set(final["probe"]) == {"latent", "main"}  # the letter model hands over its block output too
    page = client.get(f"/loops/sweeps/{final['sweep_id']}").get_data(as_text=True)
    section = page[page.index('id="probe"'):]
    assert "Latent state (carries its state)" in section and section.count('<table class="probe">') == 2
    assert page.count('class="trained-mark"') == 1  # latent: trained to 32 < 40; the bundled model to 256
    line = next(x for x in lines[:-1] if x["model"] == "latent" and x["k"] == 40)
    near = line["stop_near_k"]
    assert set(near) == {"k−10", "k−1", "k"} and near["k"] >= 0.5 > near["k−1"]  # runs stop at k: no k+1
    assert page.count('<table class="sweep-near-k">') == 2
    paths = final["paths"]["latent"]
    assert [run["k"] for run in paths] == [3, 3, 12, 12, 40, 40]  # two runs a k, on shared axes
    assert [len(run["points"]) for run in paths] == [3, 3, 12, 12, 40, 40]
    assert page.count('class="sweep-path"') == 12  # both models' pictures
    assert ">trained to 32</text>" in page and ">beyond →</text>" in page


def test_two_checkpoints_side_by_side_each_with_its_states_path_and_the_same_forcing(app):
    client = app.test_client()
    csrf = csrf_of(client, "/loops/")
    final = run_live(client, csrf, steps="4", mapping=SMALL_CYCLE, model="latent", force_loops="9")[-1][1]
    trace_id = re.search(r'href="/loops/traces/([0-9a-f]+)">Private link', final).group(1)
    both = client.post(f"/loops/traces/{trace_id}/compare", data={"csrf_token": csrf, "model": "latent-early"})
    assert both.status_code == 303
    page = client.get(both.headers["Location"]).get_data(as_text=True)
    assert page.count('aria-label="The state\'s path over the loops') == 2
    assert len(re.findall(r"9 loops, [0-9]+ distinct place", page)) == 2  # the second was forced to 9 loops too
    for column in ("-1", "-2"):  # each column with its own ids: what its state did, side by side
        assert f'id="trajectory{column}"' in page and f'id="near-k{column}"' in page
    assert page.count('class="chart settle"') == 2


def test_a_large_sweep_keeps_states_at_every_k_and_lets_them_go_when_it_ends(app, monkeypatch):
    from webapp.loops import sweeping
    monkeypatch.setattr(sweeping, "PROBE_RUNS", 6)  # 6 // 3 k = 2, so at least 4 runs a k are kept
    lines = lines_of(app.test_client().post("/api/loops/sweep", json={
        "model": "latent", "family": "function", "k": [3, 12, 40], "tables": 6, "seed": 9}))
    final = lines[-1]
    assert sorted({run["k"] for run in final["paths"]["latent"]}) == [3, 12, 40]  # the last k too
    assert final["probe"]["latent"]["rows"][1]["n"][2] > 0  # held-out states at loops 33-64, from k = 40
    readout = final["probe"]["latent"]["rows"][0]
    assert readout["back"] is None and readout["n"][0] == 3 * (3 + 8 + 8)  # loops 1-8 of the 3 held-out runs a k
    job = next(j for j in glassbox(app).service(sweeping.Sweeps)._jobs.values()
               if j.result.sweep_id == final["sweep_id"])
    assert job.result.probe_runs == {} and job.result.readout == {}  # the states are let go
