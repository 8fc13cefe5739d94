"""Sweeps through the Flask test client: POST /api/loops/sweep on the bundled and the early checkpoint,
its 400s and limits, Stop, and the sweep's page live and saved."""

import json
import re

import pytest

from tests.conftest import csrf_of, make_app, sse_events, wait_for
from tests.loops.test_sweep import seed_score
from webapp.loops.model.checkpoint import load_bundle
from webapp.loops.sweep import MEASURES, WRONG_K, k_line
from webapp.loops.sweeping import ALONE_IN_FLIGHT, Sweeps
from webapp.loops.task import execute
from webapp.web.state import glassbox

SWEEP = {"model": ["main", "early"], "family": "function", "k": [1, 6, 12], "tables": 3, "seed": 20_261_202}


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    """The bundled model and its early checkpoint (offered beside it by default)."""
    app = make_app(tmp_path_factory.mktemp("sweeps"), {"loops": load_bundle()})
    yield app
    glassbox(app).core.shutdown()


@pytest.fixture
def slow_app(tmp_path):
    from tests.support.loop_models import bundle
    app = make_app(tmp_path, {"loops": bundle(delay=0.02)}, max_jobs_per_owner=2)
    yield app
    glassbox(app).core.shutdown()


def lines_of(response):
    return [json.loads(line) for line in response.get_data(as_text=True).splitlines() if line.strip()]


def test_each_k_line_is_the_seed_scoring_of_its_own_runs_and_runs_repeat_alone(bundled):
    client = bundled.test_client()
    response = client.post("/api/loops/sweep", json={**SWEEP, "runs": True})
    assert response.status_code == 200 and response.mimetype == "application/x-ndjson"
    lines = lines_of(response)
    *per_k, summary = lines
    assert sorted((line["model"], line["k"]) for line in per_k) == sorted(
        (m, k) for m in SWEEP["model"] for k in SWEEP["k"])
    for line in per_k:
        assert line["n"] == SWEEP["tables"] == len(line["runs"])
        runs = line.pop("runs")
        near = line["stop_near_k"]  # from the runs' rows, not their summaries (test_state_views checks it)
        assert {key: v for key, v in line.items() if key != "stop_near_k"} == {
            "model": line["model"], **k_line(line["k"], [r["summary"] for r in runs])}
        assert set(near) <= {"k−100", "k−10", "k−1", "k", "k+1"} and "k" in near
        for run in runs:  # repeated alone through the trace API: the same summary, and the seed's scoring
            assert run["request"]["steps"] == line["k"] and set(run["request"]) == {"mapping", "start", "steps"}
            alone = lines_of(client.post(f"/api/loops/trace?model={line['model']}", json=run["request"]))
            rows, final = alone[:-1], alone[-1]
            assert final["summary"] == run["summary"]
            expected = execute(dict(map(tuple, run["request"]["mapping"])), run["request"]["start"], line["k"])
            scored = seed_score(expected, [r["prediction"] for r in rows], final["summary"]["stop_reason"])
            assert scored == {m: run["summary"][m] for m in MEASURES}
        for measure in MEASURES:  # as scripts/eval_loops.py reports them: a fraction of the k's runs
            assert line[measure] == sum(r["summary"][measure] for r in runs) / line["n"]
    assert summary["status"] == "complete" and summary["n"] == 18 and summary["sweep_id"]
    assert set(summary["models"]) == {"main", "early"}
    # the early checkpoint fails somewhere the bundled one does not: listed, on the same table
    early = [line for line in per_k if line["model"] == "early"]
    assert any(line["joint_success"] < 1 for line in early)
    assert summary["disagreements"] and all(
        set(d["summaries"]) == {"main", "early"} for d in summary["disagreements"])
    # without "runs" the lines are the same, without their runs (each written as its k ends on its model:
    # the two models' lines of one k may come in either order)
    again = lines_of(client.post("/api/loops/sweep", json=SWEEP))

    def in_order(lines: list[dict]) -> list[dict]:
        return sorted(lines, key=lambda line: (line["k"], line["model"]))
    assert in_order(again[:-1]) == in_order(per_k)


def test_the_same_seed_gives_the_same_tables_and_lines(bundled):
    client = bundled.test_client()
    one = lines_of(client.post("/api/loops/sweep", json={**SWEEP, "model": "early", "k": [6], "runs": True}))
    two = lines_of(client.post("/api/loops/sweep", json={**SWEEP, "model": "early", "k": [6, 12], "runs": True}))
    assert one[0] == next(line for line in two if line["k"] == 6)


@pytest.mark.parametrize("body, message", [
    ({**SWEEP, "k": [0, 3]}, WRONG_K),
    ({**SWEEP, "family": "spiral"}, "Family must be one of function, permutation, cycle, cycle_tail, identity"),
    ({**SWEEP, "extra": 1}, "Supply family, k, tables and seed (model and runs are optional), and nothing else"),
    ({**SWEEP, "tables": 101}, "Tables must be an integer from 1 to 100"),
    ({**SWEEP, "k": {"from": 1, "to": 256}, "tables": 5},
     "A sweep may make at most 2000 runs (k values × tables × models); this one asks for 2560"),
    ({**SWEEP, "model": "late"}, "model must be one of the models offered, or a list of two of them: "
     "main, early, latent, latent-early"),
])
def test_bad_sweeps_get_400_with_the_exact_message(bundled, body, message):
    response = bundled.test_client().post("/api/loops/sweep", json=body)
    assert response.status_code == 400 and response.get_json() == {"error": message}


def test_not_json_and_a_bad_model_on_the_trace_api(bundled):
    client = bundled.test_client()
    response = client.post("/api/loops/sweep", data="x", content_type="application/json")
    assert response.get_json() == {"error": "Send the request as JSON (Content-Type: application/json)"}
    bad = client.post("/api/loops/trace?model=late", json={"mapping": [[s, s] for s in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"],
                                                          "start": "A", "steps": 2})
    assert bad.status_code == 400
    assert bad.get_json() == {"error": "model must be one of the models offered: main, early, latent, latent-early"}


def test_the_bounds_are_settings(tmp_path):
    from tests.support.loop_models import bundle
    app = make_app(tmp_path, {"loops": bundle()}, sweep_max_tables=2, sweep_max_runs=3)
    try:
        client = app.test_client()
        body = {"family": "cycle", "k": [1, 2], "tables": 3, "seed": 1}
        assert client.post("/api/loops/sweep", json=body).get_json() == {
            "error": "Tables must be an integer from 1 to 2"}
        assert client.post("/api/loops/sweep", json={**body, "tables": 2}).get_json() == {
            "error": "A sweep may make at most 3 runs (k values × tables × models); this one asks for 4"}
    finally:
        glassbox(app).core.shutdown()


def running_sweep(app, owner="o", client="10.0.0.1"):
    from webapp.loops.sweep import SweepSpec
    spec = SweepSpec.parse({"family": "cycle", "k": [30], "tables": 20, "seed": 1}, models=["main"],
                           max_tables=100, max_runs=1000)
    return glassbox(app).service(Sweeps).start(owner, client, spec)


def test_one_sweep_per_browser_and_two_per_address_cookie_or_not(slow_app):
    first = running_sweep(slow_app, "someone", "127.0.0.1")
    first.watched_elsewhere()
    client = slow_app.test_client()
    body = {"family": "cycle", "k": [2], "tables": 1, "seed": 1}
    with client.session_transaction() as session:
        session["owner"] = "someone"
    refused = client.post("/api/loops/sweep", json=body)
    assert refused.status_code == 429 and "already have" in refused.get_json()["error"]
    second = running_sweep(slow_app, "another", "127.0.0.1")
    second.watched_elsewhere()
    cookieless = slow_app.test_client().post("/api/loops/sweep", json=body)  # a new owner, the same address
    assert cookieless.status_code == 429 and "your address" in cookieless.get_json()["error"]
    # its runs count as one job of the browser's, however many are in flight (a few, on a model whose runs
    # cannot step together), so the browser can still run one of its own
    core = glassbox(slow_app).core
    assert wait_for(lambda: any(j.kind == "loops" for j in core.running_jobs()))
    assert sum(1 for j in core._jobs.values() if j.owner == "someone" and not j.finished_state) <= ALONE_IN_FLIGHT
    assert core._active_jobs("someone") == 1
    first.cancel()
    second.cancel()
    assert wait_for(lambda: first.finished_state and second.finished_state)
    assert first.state == "cancelled"
    assert wait_for(lambda: not any(j.owner in ("someone", "another") and not j.finished_state
                                    for j in core._jobs.values()))


def test_stop_on_the_page_cancels_the_sweep_and_its_runs(slow_app):
    client = slow_app.test_client()
    csrf = csrf_of(client, "/loops/")
    started = client.post("/loops/sweeps", data={"csrf_token": csrf, "model": "main", "family": "cycle",
                                                 "k": "20-40", "tables": "5", "seed": "3"})
    assert started.status_code == 303
    live = client.get(started.headers["Location"]).get_data(as_text=True)
    assert "sse-connect" in live and "Stop the sweep" in live
    assert 'http-equiv="refresh"' in live.split("</head>")[0]  # without JavaScript it reloads (the head's meta)
    job_id = started.headers["Location"].rstrip("/").split("/")[-1]
    stop = re.search(r'action="([^"]+/stop)"', live).group(1)
    assert client.post(stop, data={"csrf_token": csrf}).status_code == 303
    events = sse_events(client.get(f"/loops/sweeps/live/{job_id}/stream").get_data(as_text=True))
    assert events[-1][0] == "done" and "Stopped." in events[-1][1]
    core = glassbox(slow_app).core
    assert wait_for(lambda: not any(j.kind == "loops" and not j.finished_state for j in core._jobs.values()))


def test_closing_the_api_stream_stops_the_sweep(slow_app):
    response = slow_app.test_client().post("/api/loops/sweep", json={"family": "cycle", "k": [40], "tables": 10,
                                                                     "seed": 1})
    iterator = iter(response.response)
    next(iterator)
    response.close()
    sweeps = glassbox(slow_app).service(Sweeps)
    assert wait_for(lambda: all(j.finished_state for j in sweeps._jobs.values()))
    assert all(j.state == "cancelled" for j in sweeps._jobs.values())


def test_the_page_fills_in_live_then_is_saved_and_shared(bundled):
    client = bundled.test_client()
    csrf = csrf_of(client, "/loops/")
    page = client.get("/loops/").get_data(as_text=True)
    assert 'id="sweep-run"' in page and 'name="compare"' in page
    bad = client.post("/loops/sweeps", data={"csrf_token": csrf, "model": "main", "compare": "early",
                                             "family": "function", "k": "0-3", "tables": "2", "seed": "1"})
    assert bad.status_code == 400 and WRONG_K.replace('"', "&#34;") in bad.get_data(as_text=True)
    started = client.post("/loops/sweeps", data={"csrf_token": csrf, "model": "main", "compare": "early",
                                                 "family": "function", "k": "1,6,12", "tables": "3",
                                                 "seed": str(SWEEP["seed"])})
    job_id = started.headers["Location"].rstrip("/").split("/")[-1]
    events = sse_events(client.get(f"/loops/sweeps/live/{job_id}/stream").get_data(as_text=True))
    names = [name for name, _ in events]
    assert names.count("line") == 6 and names[-1] == "done"
    # each finished k adds its row, however late the stream was opened
    assert [data.count('data-k="') for name, data in events if name == "line"] == [1, 2, 3, 4, 5, 6]
    # the state's paths fill in as each k finishes: one run at the first k, then more
    first_line = next(data for name, data in events if name == "line")
    assert first_line.count('<figure class="sweep-paths">') >= 1 and 'class="sweep-path"' in first_line
    final = events[-1][1]
    # per model: accuracy, stops, and first wrong loops where some run took a wrong hop (the early one's)
    assert final.count('class="chart sweep-chart"') == 5 and "k (hops asked for)" in final and "stop loop − k" in final
    # and per model that hands over its state, its runs' paths
    assert final.count('<figure class="sweep-paths">') == 2 and final.count("<svg") == 7
    assert "Tables on which they disagree" in final and "Open as trace" in final
    saved = re.search(r'/loops/sweeps/([0-9a-f]+)\.json', final).group(1)
    assert client.get(started.headers["Location"]).status_code == 303  # finished: its saved page
    page = client.get(f"/loops/sweeps/{saved}").get_data(as_text=True)
    assert page.count("<svg") >= 5 and "sse-connect" not in page
    assert client.get(f"/loops/traces/{saved}").status_code == 404  # a sweep is not a trace
    assert json.loads(client.get(f"/loops/sweeps/{saved}.json").data)["summary"]["sweep"]["seed"] == SWEEP["seed"]
    assert bundled.test_client().get(f"/loops/sweeps/{saved}.json").status_code == 404  # kept, still the owner's
    client.post(f"/loops/sweeps/{saved}/share", data={"csrf_token": csrf})
    link = re.search(r'value="(http[^"]+/loops/shared/[^"]+)"', client.get(f"/loops/sweeps/{saved}").get_data(
        as_text=True)).group(1)
    shared = bundled.test_client().get(link.split("localhost")[-1]).get_data(as_text=True)
    assert "Shared read-only" in shared and shared.count("<svg") >= 5 and "Open as trace" not in shared
    assert "Saved sweeps" in client.get("/loops/").get_data(as_text=True)
    # a disagreeing table opens as a trace of that model (a plain form: the run waits, then its page)
    form = re.search(r'<form method="post" action="/loops/run" class="open-trace">(.*?)</form>', final, re.S).group(1)
    fields = re.findall(r'name="(\w+)" value="([^"]*)"', form)
    data = {}
    for name, value in fields:
        data.setdefault(name, []).append(value)
    opened = client.post("/loops/run", data=data)
    assert opened.status_code == 303 and "/loops/traces/" in opened.headers["Location"]


def test_with_api_keys_a_sweep_needs_one_and_the_key_owns_it(tmp_path):
    from tests.support.loop_models import bundle
    from tests.v1.conftest import KEY, write_keys
    keys = write_keys(tmp_path / "api_keys", KEY)
    app = make_app(tmp_path, {"loops": bundle()}, api_keys=str(keys))
    try:
        body = {"family": "cycle", "k": [2], "tables": 1, "seed": 1}
        missing = app.test_client().post("/api/loops/sweep", json=body)
        assert missing.status_code == 401 and "API key" in missing.get_json()["error"]
        assert app.test_client().post("/api/loops/sweep", data="x", headers={
            "Authorization": "Bearer wrong"}).status_code == 401  # the key first, whatever was sent
        ok = lines_of(app.test_client().post("/api/loops/sweep", json=body,
                                             headers={"Authorization": f"Bearer {KEY}"}))
        assert ok[-1]["status"] == "complete" and ok[0]["joint_success"] == 1.0
        owners = {j.owner for j in glassbox(app).service(Sweeps)._jobs.values()}
        assert len(owners) == 1 and "key-" in next(iter(owners))  # the key's owner, not a throwaway one
    finally:
        glassbox(app).core.shutdown()


def test_the_trace_api_on_another_model_says_its_checkpoint(bundled):
    request = {"mapping": [[s, s] for s in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"], "start": "A", "steps": 2}
    lines = lines_of(bundled.test_client().post("/api/loops/trace?model=early&stream=snapshots", json=request))
    assert {line["checkpoint"] for line in lines} == {load_bundle("models/loops-early").checkpoint_id}


def test_the_presenters_sweep_fills_in_on_the_followers_screens_and_only_the_presenter_stops_it(slow_app):
    """Issue 51: the sweep the presenter of a Loop lab opens is the followers' view, live then saved; a
    follower's page has no Stop, and leaving its stream never stops the presenter's sweep."""
    client, follower = slow_app.test_client(), slow_app.test_client()
    csrf = csrf_of(client, "/loops/")
    client.post("/loops/present", data={"csrf_token": csrf})
    link = re.search(r'value="http://localhost(/follow/[A-Za-z0-9_-]+)"',
                     client.get("/loops/").get_data(as_text=True)).group(1)
    token = link.rsplit("/", 1)[1]
    twin = f"/loops/follow/{token}/sweep"
    assert follower.get(twin).status_code == 409  # nothing shown yet
    started = client.post("/loops/sweeps", data={"csrf_token": csrf, "model": "main", "family": "cycle",
                                                 "k": "20-24", "tables": "3", "seed": "3"})
    job_id = started.headers["Location"].rstrip("/").split("/")[-1]
    assert client.get(started.headers["Location"]).status_code == 200
    page = follower.get(link).get_data(as_text=True)
    assert "<strong>a sweep</strong>" in page and f'data-view="{twin}"' in page
    live = follower.get(twin).get_data(as_text=True)
    assert f'sse-connect="{twin}/stream"' in live and "Stop the sweep" not in live and "Back to the presenter" in live
    left = follower.get(f"{twin}/stream", buffered=False)
    assert next(left.response).startswith(b": open")
    left.close()  # a follower leaving
    sweeps = glassbox(slow_app).service(Sweeps)
    job = sweeps.job(client_owner(client), job_id)
    assert job is not None and job.state != "cancelled"
    events = sse_events(follower.get(f"{twin}/stream").get_data(as_text=True))  # to its end
    assert events[-1][0] == "done" and "Stop the sweep" not in events[-1][1]
    assert job.state == "done" and job.result.sweep_id
    saved = follower.get(twin).get_data(as_text=True)  # the finished sweep, from its saved file
    assert "sse-connect" not in saved and saved.count("<svg") >= 2
    client.post("/loops/unpresent", data={"csrf_token": csrf})
    assert follower.get(twin).status_code == 404


def client_owner(client) -> str:
    with client.session_transaction() as session:
        return session["owner"]
