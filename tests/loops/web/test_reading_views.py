"""Which rule each loop read, through the Flask test client with the bundled model: the JSON API's
rows (plain by default, with ?attention=1 when asked), the player's shaded prompt and the table's
"read" column, saved traces (download, upload, replay, share) and a model without the block."""

from __future__ import annotations

import json
import random
import re
from io import BytesIO

import pytest

from tests.conftest import csrf_of, make_app, sse_events
from tests.loops.web.test_lab import CYCLE, run_live
from webapp.loops.model.checkpoint import load_bundle
from webapp.loops.task import preset, render_prompt
from webapp.web.state import glassbox

ROW_KEYS = {"loop", "prediction", "direct_prediction", "stop_probability", "top3", "arrival_seconds",
            "expected", "correct", "edge_valid"}


@pytest.fixture
def bundled_app(tmp_path):
    app = make_app(tmp_path, {"loops": load_bundle()})
    yield app
    glassbox(app).core.shutdown()


def lines_of(response) -> list[dict]:
    return [json.loads(line) for line in response.get_data(as_text=True).splitlines() if line.strip()]


def upload(client, data: bytes):
    return client.post("/loops/traces/upload", content_type="multipart/form-data",
                       data={"csrf_token": csrf_of(client, "/loops/"), "trace": (BytesIO(data), "t.json")})


def test_api_rows_keep_their_shape_unless_attention_is_asked_for(bundled_app):
    client = bundled_app.test_client()
    request = {"mapping": CYCLE, "start": "C", "steps": 3}
    plain = lines_of(client.post("/api/loops/trace", json=request))
    assert [set(row) for row in plain[:-1]] == [ROW_KEYS] * 3 and "trace" not in plain[-1]
    snapshots = lines_of(client.post("/api/loops/trace?stream=snapshots", json=request))
    assert all(set(row) == ROW_KEYS for line in snapshots for row in line["trace"])
    asked = lines_of(client.post("/api/loops/trace?attention=1", json=request))
    assert [row["read"]["source"] for row in asked[:-1]] == ["C", "D", "E"]   # the letter it was on
    for row in asked[:-1]:
        assert set(row) == ROW_KEYS | {"read", "attention"}
        assert all(sum(head) == pytest.approx(1, abs=1e-3) for head in row["attention"])
    asked = lines_of(client.post("/api/loops/trace?stream=snapshots&attention=1", json=request))
    assert all("attention" in row for row in asked[-1]["trace"])
    bad = client.post("/api/loops/trace?attention=yes", json=request)
    assert bad.status_code == 400 and bad.get_json() == {"error": "attention must be 0 or 1"}


def test_the_player_shades_the_prompt_and_the_table_says_which_rule_each_loop_read(bundled_app):
    client = bundled_app.test_client()
    final = run_live(client, csrf_of(client, "/loops/"), steps="4")[-1][1]
    assert final.count('<td class="read">') == 4 and "A → B <small>" in final
    trace_id = re.search(r'href="/loops/traces/([0-9a-f]+)">Private link', final).group(1)
    page = client.get(f"/loops/traces/{trace_id}?loop=3").get_data(as_text=True)
    assert "Where loop 3 looked" in page
    assert re.search(r'It read the rule <strong class="read-rule">C → D</strong>\s+with \d+% of its attention', page)
    strips = re.findall(r'<code class="prompt-chars">(.*?)</code>', page)
    assert len(strips) == 1 + 2                                         # combined, then one per head
    for strip in strips:
        chars = re.findall(r'<span class="pc w(\d)" title="[0-9.]+">(.)</span>', strip)
        assert "".join(c for _, c in chars) == render_prompt(CYCLE, "A", 4)   # the prompt as the model sees it
        assert max(int(s) for s, _ in chars) == 9 and chars[6] == ("9", "C")   # C's rule, darkest
    assert 'style="' not in page.split('id="attention"')[1].split("</section>")[0]   # CSP: classes only


def test_download_upload_replay_and_share_keep_the_attention(bundled_app):
    owner, other = bundled_app.test_client(), bundled_app.test_client()
    csrf = csrf_of(owner, "/loops/")
    final = run_live(owner, csrf, steps="3")[-1][1]
    trace_id = re.search(r'href="/loops/traces/([0-9a-f]+)">Private link', final).group(1)
    saved = owner.get(f"/loops/traces/{trace_id}.json").get_json()
    assert all("attention" in row and "read" in row for row in saved["trace"])
    replay = sse_events(owner.get(f"/loops/traces/{trace_id}/replay").get_data(as_text=True))
    assert "".join(data for name, data in replay if name == "rows").count('<td class="read">') == 3
    # a hand-edited "read" is worked out again from the weights
    tampered = json.loads(json.dumps(saved))
    tampered["trace"][0]["read"] = {"source": "Z", "destination": "A", "mass": 1}
    up = upload(other, json.dumps(tampered).encode())
    assert up.status_code == 303
    copy = other.get(up.headers["Location"] + ".json").get_json()
    assert [r["read"] for r in copy["trace"]] == [r["read"] for r in saved["trace"]]
    assert [r["attention"] for r in copy["trace"]] == [r["attention"] for r in saved["trace"]]
    owner.post(f"/loops/traces/{trace_id}/share", data={"csrf_token": csrf})
    page = owner.get(f"/loops/traces/{trace_id}").get_data(as_text=True)
    token = re.search(r'id="share-url" type="text" readonly value="[^"]+/([^"/]+)"', page).group(1)
    assert "Where loop 3 looked" in other.get(f"/loops/shared/{token}").get_data(as_text=True)


def test_an_old_trace_without_attention_still_uploads_and_replays(bundled_app):
    client = bundled_app.test_client()
    old = lines_of(client.post("/api/loops/trace?stream=snapshots", json={"mapping": CYCLE, "start": "A",
                                                                         "steps": 2}))[-1]
    assert all(set(row) == ROW_KEYS for row in old["trace"])             # as a trace saved before this
    up = upload(client, json.dumps(old).encode())
    assert up.status_code == 303
    page = client.get(up.headers["Location"]).get_data(as_text=True)
    assert "Attention is not available for this model." in page and '<td class="read muted">—</td>' in page
    replay = sse_events(client.get(up.headers["Location"] + "/replay").get_data(as_text=True))
    assert replay[-1][0] == "done"


def test_an_upload_with_broken_attention_is_refused_with_a_message(bundled_app):
    client = bundled_app.test_client()
    snapshot = lines_of(client.post("/api/loops/trace?stream=snapshots&attention=1",
                                    json={"mapping": CYCLE, "start": "A", "steps": 2}))[-1]
    snapshot["trace"][1]["attention"] = [[0.5] * 10]
    response = upload(client, json.dumps(snapshot).encode())
    assert response.status_code == 400
    assert "Loop row 2: attention must hold, per head, one weight from 0 to 1" in response.get_data(as_text=True)
    heads = snapshot["trace"][0]["attention"]
    snapshot["trace"][1]["attention"] = [[10**400] + head[1:] for head in heads]  # past float's range: was a 500
    response = upload(client, json.dumps(snapshot).encode())
    assert response.status_code == 400
    assert "Loop row 2: attention must hold, per head, one weight from 0 to 1" in response.get_data(as_text=True)


def test_a_model_without_the_block_says_not_available(loop_app):
    client = loop_app.test_client()
    final = run_live(client, csrf_of(client, "/loops/"), steps="3")[-1][1]
    assert "Attention is not available for this model." in final and "Where loop 3 looked" in final
    assert final.count('<td class="read muted">—</td>') == 3


def test_a_run_to_the_cap_downloads_small_enough_to_upload_again(tmp_path):
    app = make_app(tmp_path, {"loops": load_bundle("models/loops-early")})
    try:
        client = app.test_client()
        final = run_live(client, csrf_of(client, "/loops/"), steps="256",
                         mapping=preset("function", random.Random(5)))[-1][1]
        trace_id = re.search(r'href="/loops/traces/([0-9a-f]+)">Private link', final).group(1)
        data = client.get(f"/loops/traces/{trace_id}.json").data
        saved = json.loads(data)
        assert len(saved["trace"]) == 272 and all("attention" in row for row in saved["trace"])  # the cap
        assert len(data) < app.config["MAX_CONTENT_LENGTH"]
        up = upload(client, data)
        assert up.status_code == 303
        again = client.get(up.headers["Location"] + ".json").data                # and once more
        assert len(again) < app.config["MAX_CONTENT_LENGTH"] and upload(client, again).status_code == 303
    finally:
        glassbox(app).core.shutdown()
