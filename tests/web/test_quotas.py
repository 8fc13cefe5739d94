"""Storage is bounded: per-browser quotas (conversations, saved traces, bytes) with a message, a retention
for JSON-API runs made without a cookie, and uploaded traces normalised before they are stored."""

from __future__ import annotations

import io
import json
import string
import time

import pytest

from tests.conftest import csrf_of, make_app
from tests.support.chat_models import tiny_chat_model
from tests.support.databases import app_rows
from tests.support.loop_models import bundle
from webapp.loops.service import LoopService
from webapp.web import quotas
from webapp.web.state import glassbox

LETTERS = list(string.ascii_uppercase)
CYCLE = [[a, b] for a, b in zip(LETTERS, LETTERS[1:] + LETTERS[:1])]
HX = {"HX-Request": "true"}


@pytest.fixture
def app(tmp_path, request):
    models = {"chat": tiny_chat_model(tmp_path / "chat"), "loops": bundle()}
    app = make_app(tmp_path, models, **getattr(request, "param", {}))
    yield app
    glassbox(app).core.shutdown()


def rows(app, sql, *args):
    return app_rows(app, sql, *args)


def send(client, csrf, content="hi"):
    return client.post("/chat/send", data={"csrf_token": csrf, "content": content, "max_new_tokens": "2"})


def run(client, csrf):
    return client.post("/loops/run", data={"csrf_token": csrf, "src": LETTERS, "dst": LETTERS, "start": "A",
                                           "steps": "2"})


def upload(client, snapshot):
    data = snapshot if isinstance(snapshot, bytes) else json.dumps(snapshot).encode()
    return client.post("/loops/traces/upload", content_type="multipart/form-data",
                       data={"csrf_token": csrf_of(client, "/loops/"), "trace": (io.BytesIO(data), "t.json")})


@pytest.mark.parametrize("app", [{"max_conversations": 2}], indirect=True)
def test_conversations_per_browser_are_limited_with_a_message(app):
    client = app.test_client()
    csrf = csrf_of(client, "/chat/")
    assert send(client, csrf).status_code == 303 and send(client, csrf).status_code == 303
    third = send(client, csrf)
    assert third.status_code == 403
    assert "You have 2 conversations, the most one browser may keep. Delete one" in third.get_data(as_text=True)
    assert len(rows(app, "SELECT id FROM conversations")) == 2
    assert send(app.test_client(), csrf_of(app.test_client(), "/chat/")).status_code != 500


@pytest.mark.parametrize("app", [{"max_traces": 3}], indirect=True)
def test_saved_traces_roll_the_oldest_goes(app):
    client = app.test_client()
    csrf = csrf_of(client, "/loops/")
    made = [run(client, csrf).headers["Location"] for _ in range(5)]
    assert len(rows(app, "SELECT id FROM traces")) == 3
    assert client.get(made[0]).status_code == 404 and client.get(made[-1]).status_code == 200


@pytest.mark.parametrize("app", [{"max_stored_bytes": 50}], indirect=True)
def test_the_bytes_a_browser_keeps_are_limited(app):
    client = app.test_client()
    csrf = csrf_of(client, "/chat/")
    assert send(client, csrf, "x" * 60).status_code == 303
    full = send(client, csrf, "more")
    assert full.status_code == 403 and "You have used this browser&#39;s storage" in full.get_data(as_text=True)
    loops = run(client, csrf_of(client, "/loops/"))
    assert loops.status_code == 403  # a trace would not fit either


def test_api_runs_without_a_cookie_set_none_and_are_purged_after_the_retention(app):
    client = app.test_client()
    response = client.post("/api/loops/trace", json={"mapping": CYCLE, "start": "A", "steps": 2})
    assert response.status_code == 200 and "Set-Cookie" not in response.headers
    assert response.get_data(as_text=True).count("\n") == 3  # two rows and the summary: the run is saved
    [(owner,)] = rows(app, "SELECT owner FROM traces")
    assert owner.startswith("api:")
    keeper = app.test_client()
    keeper.get("/loops/")  # a script that keeps its cookie keeps its runs, under its browser
    keeper.post("/api/loops/trace", json={"mapping": CYCLE, "start": "A", "steps": 2}).get_data()
    with app.app_context():
        hours = app.config["GLASSBOX"].api_retention_hours
        loops_store = glassbox(app).service(LoopService).store
        assert quotas.purge_api_runs(loops_store, now=time.time() + hours * 3600 - 60) == 0  # not yet
        quotas._purged["at"] = 0.0
        assert quotas.purge_api_runs(loops_store, now=time.time() + hours * 3600 + 60) == 1
    [(left,)] = rows(app, "SELECT owner FROM traces")
    assert not left.startswith("api:")


def good_snapshot(app) -> dict:
    response = app.test_client().post("/api/loops/trace?stream=snapshots",
                                      json={"mapping": CYCLE, "start": "A", "steps": 2})
    return json.loads(response.get_data(as_text=True).splitlines()[-1])


def test_uploads_are_normalised_to_known_fields(app):
    snapshot = good_snapshot(app)
    snapshot["checkpoint"] = "ok\ud800"  # a lone surrogate, as a \\ud800 escape gives it
    snapshot["evil"] = "x" * 1000
    snapshot["trace"][0]["script"] = "<script>"
    snapshot["trace"][0]["top3"][0]["extra"] = 1
    client = app.test_client()
    up = upload(client, snapshot)
    assert up.status_code == 303
    page = client.get(up.headers["Location"])
    assert page.status_code == 200
    stored = client.get(up.headers["Location"] + ".json").get_json()
    assert "evil" not in stored and "script" not in stored["trace"][0]
    assert set(stored["trace"][0]["top3"][0]) == {"symbol", "probability"}
    assert stored["checkpoint"] == "ok?"


@pytest.mark.parametrize("body, message", [
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    (None, "not JSON"),  # NaN
    ("big-probability", "probabilities from 0 to 1"),
    ("many-top3", "up to three letters"),
])
def test_bad_uploads_are_a_400_with_a_message(app, body, message):
    if body is None or isinstance(body, str):
        snapshot = good_snapshot(app)
        if body is None:
            snapshot["trace"][0]["stop_probability"] = float("nan")
        elif body == "big-probability":
            snapshot["trace"][0]["top3"][0]["probability"] = 1.5
        else:
            snapshot["trace"][0]["top3"] = snapshot["trace"][0]["top3"] * 10
        body = json.dumps(snapshot).encode()  # Python writes NaN and Infinity; they are refused
    response = upload(app.test_client(), body)
    assert response.status_code == 400 and message in response.get_data(as_text=True)


def test_deeply_nested_json_to_the_api_is_a_400(app):
    response = app.test_client().post("/api/loops/trace", data="[" * 100_000 + "]" * 100_000,
                                      content_type="application/json")
    assert response.status_code == 400 and "nested too deeply" in response.get_json()["error"]
