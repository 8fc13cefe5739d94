"""Does the state settle: the API's rows with ?state_change=1, the chart under the stop chart on the trace
page, kept through download and upload, and "not available" for a model that does not give it."""

from __future__ import annotations

import json
import re
from io import BytesIO

import pytest

from tests.conftest import csrf_of, make_app
from tests.loops.web.test_lab import CYCLE, run_live
from tests.support.loop_models import bundle as scripted_bundle
from webapp.loops.model.checkpoint import load_bundle
from webapp.web.state import glassbox


@pytest.fixture
def bundled_app(tmp_path):
    app = make_app(tmp_path, {"loops": load_bundle()})
    yield app
    glassbox(app).core.shutdown()


def lines_of(response) -> list[dict]:
    return [json.loads(line) for line in response.get_data(as_text=True).splitlines() if line.strip()]


def test_api_rows_carry_the_state_change_only_when_asked_for(bundled_app):
    client = bundled_app.test_client()
    request = {"mapping": CYCLE, "start": "C", "steps": 4}
    plain = lines_of(client.post("/api/loops/trace", json=request))
    assert all("state_change" not in row for row in plain[:-1])
    asked = lines_of(client.post("/api/loops/trace?state_change=1", json=request))
    changes = [row["state_change"] for row in asked[:-1]]
    assert changes[0] is None and all(isinstance(c, float) and c >= 0 for c in changes[1:])
    assert all("attention" not in row for row in asked[:-1])  # each opt-in on its own
    snapshots = lines_of(client.post("/api/loops/trace?stream=snapshots&state_change=1", json=request))
    assert [row["state_change"] for row in snapshots[-1]["trace"]][1:] == pytest.approx(changes[1:])
    bad = client.post("/api/loops/trace?state_change=yes", json=request)
    assert bad.status_code == 400 and bad.get_json() == {"error": "state_change must be 0 or 1"}


def test_the_trace_page_draws_the_change_under_the_stop_chart_and_keeps_it_through_upload(bundled_app):
    client = bundled_app.test_client()
    final = run_live(client, csrf_of(client, "/loops/"), steps="6")[-1][1]
    trace_id = re.search(r'href="/loops/traces/([0-9a-f]+)">Private link', final).group(1)
    page = client.get(f"/loops/traces/{trace_id}").get_data(as_text=True)
    stop_at, settle_at = page.index('aria-label="Stop probability per loop"'), page.index('id="settle"')
    assert stop_at < settle_at  # under the stop chart
    figure = page[settle_at:].split("</figure>")[0]
    assert "Does the state settle?" in figure
    saved = client.get(f"/loops/traces/{trace_id}.json").get_json()
    changes = [row["state_change"] for row in saved["trace"]]
    assert changes[0] is None and len(changes) == 6
    assert len(re.findall(r'<circle [^>]*class="settle-dot"', figure)) == 5  # loops 2..6
    for loop, change in enumerate(changes[1:], start=2):
        assert f"<title>loop {loop}: {change:.4g}</title>" in figure
    again = client.post("/loops/traces/upload", content_type="multipart/form-data",
                        data={"csrf_token": csrf_of(client, "/loops/"),
                              "trace": (BytesIO(json.dumps(saved).encode()), "t.json")})
    assert again.status_code in (200, 302, 303)
    page = client.get(again.headers["Location"]).get_data(as_text=True) if again.status_code != 200 \
        else again.get_data(as_text=True)
    assert page.count('class="settle-dot"') == 5


def test_a_model_without_it_says_not_available(tmp_path):
    app = make_app(tmp_path, {"loops": scripted_bundle()})
    try:
        client = app.test_client()
        final = run_live(client, csrf_of(client, "/loops/"), steps="3")[-1][1]
        trace_id = re.search(r'href="/loops/traces/([0-9a-f]+)">Private link', final).group(1)
        page = client.get(f"/loops/traces/{trace_id}").get_data(as_text=True)
        figure = page[page.index('id="settle"'):].split("</figure>")[0]
        assert "not available for this model" in figure and "<svg" not in figure
    finally:
        glassbox(app).core.shutdown()
