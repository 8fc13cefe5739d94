"""Inputs that were 500s (issue 25, item 9), each now a 4xx with a message: CR/LF in the theme form's
`next`, a Host label over 63 characters, a lone surrogate in /v1 text, a 400-digit integer where a
number belongs (/v1's temperature, an uploaded trace's times and probabilities). The ones that need a
real server (a malformed chunk size, the same Host through nginx) are in tests/integration/test_connections.py."""

from __future__ import annotations

import io
import json
import string

import pytest

from tests.conftest import csrf_of

HUGE = int("9" * 400)  # float() of it overflows
LETTERS = string.ascii_uppercase


@pytest.mark.parametrize("back", ["/chat/\r\nX-Evil: 1", "/loops/\n", "/\r", "/\x00", "/a\x7f"])
def test_control_characters_in_the_theme_forms_next_are_a_400(loop_app, back):
    client = loop_app.test_client()
    response = client.post("/prefs/theme", data={"csrf_token": csrf_of(client, "/loops/"), "next": back})
    assert response.status_code == 400 and "X-Evil" not in response.headers
    assert "control character" in response.get_data(as_text=True)


@pytest.mark.parametrize("path", ["/", "/chat/", "/loops/", "/v1/models", "/api/loops/nothing", "/healthz"])
def test_a_host_label_over_63_characters_is_a_400_with_a_message(chat_app, path):
    response = chat_app.test_client().get(path, headers={"Host": "a" * 64 + ".example"})
    assert response.status_code == 400
    assert "not a valid host name" in response.get_data(as_text=True)


@pytest.fixture
def api(chat_app):
    return chat_app.test_client(use_cookies=False)


def post_raw(client, path: str, text: str):
    return client.post(path, data=text, content_type="application/json")


@pytest.mark.parametrize("path, body, param", [
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi \\ud800"}]}', "messages[0].content"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
     "messages[0].content[0].text"),
    ("/v1/chat/completions", '{"messages": [{"role": "system", "content": "\\udc80"}, '
                             '{"role": "user", "content": "hi"}]}', "messages[0].content"),
    ("/v1/completions", '{"prompt": "a\\ud800b"}', "prompt"),
    ("/v1/completions", '{"prompt": ["\\ud800"]}', "prompt"),
    ("/v1/completions", '{"prompt": "a", "stop": ["\\ud800"]}', "stop"),
])
def test_a_lone_surrogate_in_v1_text_is_a_400_naming_the_field(api, path, body, param):
    response = post_raw(api, path, body)
    assert response.status_code == 400, response.get_data(as_text=True)[:300]
    error = response.get_json()["error"]
    assert error["param"] == param and "lone surrogate" in error["message"]


@pytest.mark.parametrize("path, body, where", [
    ("/chat/directions.json", '{"model": "glassbox", "name": "d", "layer": 0, "positive": ["Hi \\ud800"], '
                              '"negative": ["Bye"]}', "'positive[0]'"),
    ("/chat/directions.json", '{"model": "glassbox", "name": "Jorda\\ud800", "layer": 0, "vector": [1]}', "'name'"),
    ("/chat/c/nope/m/1/patching/0.json", '{"corrupted": "What is the capital of Jorda\\ud800?"}', "'corrupted'"),
    ("/chat/c/nope/m/1/steer.json", '{"steer": [{"direction": "\\udfff", "alpha": 1}]}', "'steer[0].direction'"),
    ("/chat/c/nope/m/1/steer.json", '{"\\ud800": 1}', "A key"),
    ("/api/loops/trace", '{"graph": {"edges": ["A\\ud800"]}}', "'graph.edges[0]'"),
    ("/chat/directions.json", '"\\ud800"', "The body"),
])
def test_a_lone_surrogate_in_any_json_body_is_a_400_naming_where(api, path, body, where):
    """A tokenizer (and UTF-8, and so the database) cannot take one: a 500 before (issue 52, item 3)."""
    response = post_raw(api, path, body)
    assert response.status_code == 400, response.get_data(as_text=True)[:300]
    error = response.get_json()["error"]
    assert error.startswith(where) and "lone surrogate" in error, error


@pytest.mark.parametrize("path", ["/chat/directions.json", "/chat/c/nope/m/1/steer.json", "/api/loops/trace"])
def test_a_json_body_nested_too_deep_to_parse_is_a_400(api, path):
    response = post_raw(api, path, "[" * 100_000 + "]" * 100_000)
    assert response.status_code == 400 and "nested too deeply" in response.get_json()["error"]


@pytest.mark.parametrize("path, extra", [("/v1/completions", {"prompt": "a"}),
                                         ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]})])
@pytest.mark.parametrize("value", [HUGE, -HUGE])
def test_a_400_digit_temperature_is_a_400(api, path, extra, value):
    response = post_raw(api, path, json.dumps({**extra, "temperature": value, "max_tokens": 2}))
    assert response.status_code == 400, response.get_data(as_text=True)[:300]
    error = response.get_json()["error"]
    assert error["param"] == "temperature" and "(400 digits)" in error["message"] and len(error["message"]) < 300


def test_a_whole_number_temperature_still_works(api):
    response = post_raw(api, "/v1/completions", json.dumps({"prompt": "a", "temperature": 1, "max_tokens": 2}))
    assert response.status_code == 200


@pytest.fixture
def trace(loop_app):
    client = loop_app.test_client()
    csrf_of(client, "/loops/")  # a session: the run's trace is this browser's
    mapping = [[a, LETTERS[(i + 1) % 26]] for i, a in enumerate(LETTERS)]
    run = client.post("/api/loops/trace", json={"mapping": mapping, "start": "A", "steps": 3})
    trace_id = json.loads(run.get_data(as_text=True).splitlines()[-1])["trace_id"]
    return client, client.get(f"/loops/traces/{trace_id}.json").get_json()


@pytest.mark.parametrize("where", ["arrival_seconds", "stop_probability", "top3"])
def test_a_400_digit_integer_in_an_uploaded_trace_is_a_400(trace, where):
    client, snapshot = trace
    row = snapshot["trace"][1]
    if where == "top3":
        row["top3"][0]["probability"] = HUGE
    else:
        row[where] = HUGE
    response = client.post("/loops/traces/upload", content_type="multipart/form-data",
                           data={"csrf_token": csrf_of(client, "/loops/"),
                                 "trace": (io.BytesIO(json.dumps(snapshot).encode()), "t.json")})
    assert response.status_code == 400, response.get_data(as_text=True)[:300]
    assert "Loop row 2:" in response.get_data(as_text=True)
