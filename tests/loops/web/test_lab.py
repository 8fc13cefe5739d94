"""The Loop-lab page, its stream, saved traces and the JSON API, through the Flask test client."""

import json
import re

import pytest
import torch

from tests.conftest import csrf_of, make_app, sse_events
from tests.support.executors import FunctionJobs
from webapp.core import Job
from webapp.loops.task import SYMBOLS
from webapp.web.state import glassbox

CYCLE = [[s, SYMBOLS[(i + 1) % 26]] for i, s in enumerate(SYMBOLS)]


def form(csrf, steps="4", start="A", mapping=CYCLE, **extra):
    return {"csrf_token": csrf, "start": start, "steps": steps, "src": [s for s, _ in mapping],
            "dst": [d for _, d in mapping], **extra}


def run_live(client, csrf, **kw):
    started = client.post("/loops/run", data=form(csrf, **kw), headers={"HX-Request": "true"})
    assert started.status_code == 200, started.get_data(as_text=True)
    url = re.search(r'sse-connect="([^"]+)"', started.get_data(as_text=True)).group(1)
    return sse_events(client.get(url).get_data(as_text=True))


def test_page_shows_editor_with_26_rules_in_order(loop_app):
    page = loop_app.test_client().get("/loops/").get_data(as_text=True)
    assert page.count('name="src"') == 26 and page.count('name="dst"') == 26
    assert "Run" in page and "Random function" in page


def test_run_streams_rows_then_a_summary_with_pictures(loop_app):
    client = loop_app.test_client()
    events = run_live(client, csrf_of(client, "/loops/"))
    rows = "".join(data for name, data in events if name == "rows")
    assert rows.count("<tr") == 4 and rows.index("<td>1</td>") < rows.index("<td>4</td>")
    assert events[-1][0] == "done"
    final = events[-1][1]
    assert "Solved" in final and "<svg" in final and "Private link" in final
    assert final.count("<tr") == 5  # header + 4 rows
    # the saved-traces list is refreshed out of band with the run just saved
    assert 'id="saved-traces" hx-swap-oob="true"' in final and "k = 4" in final


@pytest.mark.parametrize("loop_threads", [1, 0])
def test_loop_runs_use_their_own_thread_count_and_give_the_worker_back_its_own(tmp_path, loop_threads):
    from tests.support.loop_models import bundle
    b = bundle()
    app = make_app(tmp_path, {"loops": b}, torch_threads=2, loop_torch_threads=loop_threads)
    core = glassbox(app).core
    try:
        client = app.test_client()
        run_live(client, csrf_of(client, "/loops/"))
        assert b.model.threads_seen == (loop_threads or 2)  # 0: the worker's own setting
        core.executors["probe"] = FunctionJobs()
        after = core.submit(Job("probe", "o", lambda job, c: job.result.update(threads=torch.get_num_threads())))
        list(after.subscribe(0.05))
        assert after.result["threads"] == 2
    finally:
        core.shutdown()


def test_invalid_steps_shows_message_inline_and_keeps_the_table(loop_app):
    client = loop_app.test_client()
    csrf = csrf_of(client, "/loops/")
    mapping = [CYCLE[1], CYCLE[0], *CYCLE[2:]]
    for steps in ("0", "abc", "2.5", "257"):
        response = client.post("/loops/run", data=form(csrf, steps=steps, mapping=mapping),
                               headers={"HX-Request": "true"})
        html = response.get_data(as_text=True)
        assert response.status_code == 400
        assert 'id="steps-error"' in html and "Steps must be an integer from 1 to 256" in html
        assert f'value="{steps}"' in html  # what was typed is kept
        assert html.index('value="B"') < html.index('value="A"')  # and so is the rule order


def test_run_without_javascript_redirects_to_the_saved_trace(loop_app):
    client = loop_app.test_client()
    response = client.post("/loops/run", data=form(csrf_of(client, "/loops/")))
    assert response.status_code == 303
    page = client.get(response.headers["Location"]).get_data(as_text=True)
    assert "Solved" in page and page.count("<tr") == 5


def test_editor_moves_and_presets(loop_app):
    client = loop_app.test_client()
    csrf = csrf_of(client, "/loops/")
    html = client.post("/loops/editor", data=form(csrf, action="down:0"),
                       headers={"HX-Request": "true"}).get_data(as_text=True)
    assert re.findall(r'name="src" value="(\w)"', html)[:3] == ["B", "A", "C"]
    html = client.post("/loops/editor", data=form(csrf, action="preset:identity"),
                       headers={"HX-Request": "true"}).get_data(as_text=True)
    sources = re.findall(r'name="src" value="(\w)"', html)
    assert sources == list(SYMBOLS)


def test_api_streams_one_row_per_loop_then_the_summary(loop_app):
    client = loop_app.test_client()
    response = client.post("/api/loops/trace", json={"mapping": CYCLE, "start": "C", "steps": 3})
    assert response.mimetype == "application/x-ndjson"
    lines = [json.loads(line) for line in response.get_data(as_text=True).splitlines() if line.strip()]
    assert [line.get("loop") for line in lines] == [1, 2, 3, None]
    assert [line["prediction"] for line in lines[:3]] == ["D", "E", "F"]
    final = lines[-1]
    assert final["status"] == "complete" and final["summary"]["joint_success"] is True
    assert final["schema_version"] == 1 and final["trace_id"] and "trace" not in final  # no rows twice
    big = client.post("/api/loops/trace", json={"mapping": CYCLE, "start": "A", "steps": 256})
    assert len(big.data) < 200_000  # rows, not cumulative snapshots (those were ~12 MB)
    assert client.post("/api/loops/trace?stream=everything", json={}).status_code == 400


def test_api_streams_snapshots_when_asked_and_rejects_bad_input(loop_app):
    client = loop_app.test_client()
    bad = client.post("/api/loops/trace", json={"mapping": CYCLE, "start": "A", "steps": True})
    assert bad.status_code == 400 and bad.get_json() == {"error": "Steps must be an integer from 1 to 256"}
    extra = client.post("/api/loops/trace", json={"mapping": CYCLE, "start": "A", "steps": 3, "x": 1})
    assert extra.get_json() == {"error": "Supply exactly mapping, start, and steps"}
    response = client.post("/api/loops/trace?stream=snapshots", json={"mapping": CYCLE, "start": "C", "steps": 3})
    lines = [json.loads(line) for line in response.get_data(as_text=True).splitlines() if line.strip()]
    assert [row["status"] for row in lines] == ["streaming"] * 3 + ["complete"]
    assert [len(row["trace"]) for row in lines[:3]] == [1, 2, 3]
    assert lines[-1]["summary"]["joint_success"] is True and lines[-1]["schema_version"] == 1
    assert [r["prediction"] for r in lines[-1]["trace"]] == ["D", "E", "F"]


def test_trace_belongs_to_its_browser_and_replays(loop_app):
    owner, stranger = loop_app.test_client(), loop_app.test_client()
    response = owner.post("/loops/run", data=form(csrf_of(owner, "/loops/")))
    trace_url = response.headers["Location"]
    trace_id = trace_url.rsplit("/", 1)[1]
    assert stranger.get(trace_url).status_code == 404
    assert stranger.get(f"/loops/traces/{trace_id}.json").status_code == 404
    assert stranger.get(f"/loops/traces/{trace_id}/replay").status_code == 404
    download = owner.get(f"/loops/traces/{trace_id}.json")
    snapshot = download.get_json()
    assert snapshot["source"] == "live" and len(snapshot["trace"]) == 4
    replay = sse_events(owner.get(f"/loops/traces/{trace_id}/replay").get_data(as_text=True))
    assert [n for n, _ in replay][-1] == "done" and {n for n, _ in replay[:-1]} == {"rows"}
    assert "".join(data for _, data in replay[:-1]).count("<tr") == 4
    assert "recorded" in replay[-1][1]
    # uploading the file replays it for the uploader, as a recorded trace
    csrf = csrf_of(stranger, "/loops/")
    from io import BytesIO
    up = stranger.post("/loops/traces/upload", data={"csrf_token": csrf, "trace": (BytesIO(download.data), "t.json")},
                       content_type="multipart/form-data")
    assert up.status_code == 303
    copy = stranger.get(up.headers["Location"] .replace("/traces/", "/traces/", 1) + ".json").get_json()
    assert copy["source"] == "recorded" and copy["trace"] == snapshot["trace"]


def test_upload_rejects_a_bad_file_with_a_message(loop_app):
    client = loop_app.test_client()
    csrf = csrf_of(client, "/loops/")
    from io import BytesIO
    response = client.post("/loops/traces/upload", data={"csrf_token": csrf, "trace": (BytesIO(b"{nope"), "t.json")},
                           content_type="multipart/form-data")
    assert response.status_code == 400 and "not JSON" in response.get_data(as_text=True)


@pytest.mark.parametrize("version", [True, 1.0, "1"])
def test_upload_needs_the_integer_schema_version_1(loop_app, version):
    client = loop_app.test_client()
    response = client.post("/api/loops/trace?stream=snapshots", json={"mapping": CYCLE, "start": "A", "steps": 2})
    snapshot = {**json.loads(response.get_data(as_text=True).splitlines()[-1]), "schema_version": version}
    from io import BytesIO
    up = client.post("/loops/traces/upload", content_type="multipart/form-data",
                     data={"csrf_token": csrf_of(client, "/loops/"),
                           "trace": (BytesIO(json.dumps(snapshot).encode()), "t.json")})
    assert up.status_code == 400 and "schema_version 1" in up.get_data(as_text=True)


def test_tampered_upload_is_rescored_from_its_request(loop_app):
    client = loop_app.test_client()
    response = client.post("/api/loops/trace?stream=snapshots", json={"mapping": CYCLE, "start": "A", "steps": 2})
    snapshot = json.loads(response.get_data(as_text=True).splitlines()[-1])
    snapshot["trace"][0]["prediction"] = "Q"       # wrong, but the file still claims success
    from io import BytesIO
    up = client.post("/loops/traces/upload", content_type="multipart/form-data",
                     data={"csrf_token": csrf_of(client, "/loops/"),
                           "trace": (BytesIO(json.dumps(snapshot).encode()), "t.json")})
    copy = client.get(up.headers["Location"] + ".json").get_json()
    assert copy["summary"]["first_error"] == 1 and copy["trace"][0]["correct"] is False


def test_state_changes_need_the_csrf_token(loop_app):
    client = loop_app.test_client()
    client.get("/loops/")
    response = client.post("/loops/run", data=form("wrong"))
    assert response.status_code == 403


def test_a_row_shows_right_and_wrong_past_k_and_the_top_three(loop_app):
    from flask import render_template
    row = {"loop": 5, "prediction": "Q", "direct_prediction": "R", "expected": "E", "correct": False,
           "edge_valid": True, "stop_probability": 0.126, "arrival_seconds": 0.0123,
           "top3": [{"symbol": "Q", "probability": 0.7}, {"symbol": "E", "probability": 0.2},
                    {"symbol": "<", "probability": 0.1}]}
    with loop_app.test_request_context("/loops/"):
        past_k = render_template("loops/_rows.html", rows=[row], steps=4)
        within = render_template("loops/_rows.html", rows=[{**row, "correct": True}], steps=5)
    assert '<tr class="past-k">' in past_k and "<tr>" in within
    assert '<td class="bad">✗<span class="visually-hidden"> wrong</span>' in past_k
    assert '<td class="ok">✓<span class="visually-hidden"> right</span>' in within
    assert "(R)" in past_k  # the direct readout, where it differs
    assert '<meter min="0" max="1" low="0.5" optimum="1" value="0.1260">0.13</meter> 0.13' in past_k
    assert "<span>Q 0.70</span><span>E 0.20</span><span>&lt; 0.10</span>" in past_k
    assert "12.3 ms" in past_k


def test_a_replay_keeps_the_recorded_pace_and_batches(tmp_path):
    from tests.support.loop_models import bundle
    from webapp.loops.trace import FLUSH_SECONDS
    app = make_app(tmp_path, {"loops": bundle(delay=FLUSH_SECONDS * 1.5)})
    try:
        client = app.test_client()
        trace_url = client.post("/loops/run", data=form(csrf_of(client, "/loops/"), steps="3")).headers["Location"]
        replay = sse_events(client.get(f"{trace_url}/replay").get_data(as_text=True))
        assert [n for n, _ in replay] == ["rows", "rows", "rows", "done"]  # one loop each, as they arrived
    finally:
        glassbox(app).core.shutdown()


def test_a_run_this_front_end_does_not_run_ends_its_stream_with_a_message_and_its_stop_with_404(loop_app):
    """Another front end runs it (or this one restarted): the stream ends at once, never a 404 the browser
    would retry, and says where finished runs are."""
    client = loop_app.test_client()
    csrf = csrf_of(client, "/loops/")
    events = sse_events(client.get("/loops/jobs/0123456789abcdef/stream").get_data(as_text=True))
    assert [name for name, _ in events] == ["done"]
    assert "another front end runs it" in events[0][1] and "Saved traces" in events[0][1]
    stop = client.post("/loops/jobs/0123456789abcdef/stop", headers={"HX-Request": "true", "X-CSRF-Token": csrf})
    assert stop.status_code == 404 and "No such run." in stop.get_data(as_text=True)


def test_saved_traces_are_named_by_time_model_and_table_and_a_live_run_gives_its_address(loop_app):
    """Issue 31: saved traces no longer all read "start A, k = 12"; the final results carry the trace's own
    address (static/room.js puts it in the address bar; without JavaScript the run redirects there)."""
    client = loop_app.test_client()
    csrf = csrf_of(client, "/loops/")
    final = run_live(client, csrf)[-1][1]
    trace_id = re.search(r'href="/loops/traces/(\w+)"', final).group(1)
    assert f'data-address="/loops/traces/{trace_id}"' in final
    identity = [[s, s] for s in SYMBOLS]
    run_live(client, csrf, mapping=identity)
    page = client.get("/loops/").get_data(as_text=True)
    names = re.findall(r'<time datetime="([^"]+)"[^>]*>(\d\d:\d\d:\d\d)</time>\s*· ([^·]+) · ([^·]+) · start A, k = 4',
                       page)
    assert len(names) == 2, page
    (newest_iso, _, model, newest_table), (_, _, model_2, cycle_table) = names
    assert newest_table.strip() == "identity table" and re.fullmatch(r"table [0-9a-f]{4}", cycle_table.strip())
    assert model.strip() == model_2.strip() and model.strip() != "model not recorded"
    assert newest_iso.endswith("+00:00")
