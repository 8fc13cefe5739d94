"""Every state-changing route needs the session's CSRF token: refused without it (and nothing
changes), let through with it. Routes are read from the app's URL map, so a new one is covered."""

from __future__ import annotations

import pytest

from tests.conftest import csrf_of
from webapp.web.state import glassbox

STATE_CHANGING = {"POST", "PUT", "PATCH", "DELETE"}
KNOWN = {"chat.send", "chat.stop", "chat.regenerate", "chat.edit", "chat.delete", "loops.editor", "loops.run",
         "loops.stop", "loops.upload", "loops_api.api_trace"}


def routes(app):
    for rule in app.url_map.iter_rules():
        for method in sorted(rule.methods & STATE_CHANGING):
            args = {name: 1 if "int" in type(conv).__name__.lower() else "x"
                    for name, conv in rule._converters.items()}
            yield rule.endpoint, method, rule.build(args)[1]


def test_the_known_state_changing_routes_are_all_found(chat_app):
    assert {endpoint for endpoint, _, _ in routes(chat_app)} >= KNOWN


@pytest.mark.parametrize("token", [None, "", "forged-token"])
def test_without_the_right_token_every_state_change_is_refused(chat_app, token):
    client = chat_app.test_client()
    client.get("/chat/")  # a session with a token exists; it is just not sent
    for endpoint, method, path in routes(chat_app):
        data = {"content": "hi", "start": "A", "steps": "3"}
        if token is not None:
            data["csrf_token"] = token
        response = client.open(path, method=method, data=data)
        if getattr(chat_app.view_functions[endpoint], "csrf_exempt", False):  # JSON only: a form is refused
            assert 400 <= response.status_code < 500 and response.status_code != 403, (endpoint, path)
            if endpoint in KNOWN:  # ours says what to send (others may answer in their API's own way)
                assert response.status_code == 415, (endpoint, path, response.status_code)
                assert "Content-Type: application/json" in response.get_data(as_text=True)
            continue
        assert response.status_code == 403, (endpoint, path, response.status_code)
        assert "expired" in response.get_data(as_text=True)
    assert glassbox(chat_app).core.counters["submitted"] == 0
    assert client.get("/chat/").get_data(as_text=True).count("/chat/c/") == 0  # no conversation made


def test_with_the_token_every_state_change_gets_past_the_check(chat_app):
    client = chat_app.test_client()
    csrf = csrf_of(client, "/chat/")
    for endpoint, method, path in routes(chat_app):
        # form field for plain forms, header for htmx: both are accepted
        for how in ({"data": {"csrf_token": csrf}}, {"data": {}, "headers": {"X-CSRF-Token": csrf}}):
            response = client.open(path, method=method, **how)
            assert response.status_code != 403, (endpoint, path, how)


def test_another_sessions_token_is_refused(chat_app):
    theirs = csrf_of(chat_app.test_client(), "/chat/")
    mine = chat_app.test_client()
    mine.get("/chat/")
    assert mine.post("/chat/send", data={"content": "hi", "csrf_token": theirs}).status_code == 403


def test_the_json_api_is_exempt_only_for_json_which_a_cross_site_form_cannot_send(chat_app):
    client = chat_app.test_client()
    as_form = client.post("/api/loops/trace", data='{"mapping": [], "start": "A", "steps": 1}',
                          content_type="text/plain")
    assert as_form.status_code == 415  # refused, and told what to send rather than "reload the page"
    assert as_form.get_json() == {"error": "This endpoint takes JSON: send the body with "
                                           "Content-Type: application/json."}
    as_json = client.post("/api/loops/trace", json={"mapping": [], "start": "A", "steps": 1})
    assert as_json.status_code == 400 and as_json.get_json()["error"].startswith("Supply all 26")
    assert "Access-Control-Allow-Origin" not in as_json.headers  # no CORS: other origins cannot read it


def test_a_csrf_token_with_non_ascii_characters_is_refused_not_a_500(chat_app):
    client = chat_app.test_client()
    client.get("/chat/")  # a session with a token of its own
    for token in ("\u0080", "é" * 32):
        sent = client.post("/chat/sampling/reset", data={"csrf_token": token})
        assert sent.status_code == 403 and "This form has expired" in sent.get_data(as_text=True)
    assert client.post("/chat/send", headers={"X-CSRF-Token": "\u00e9"}, data={"content": "hi"}).status_code == 403
