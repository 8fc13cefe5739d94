"""The session cookie and the clock: a cookie this server signed is kept when its date is ahead of the
clock (a clock stepping back), so the browser keeps its conversations; a cookie past its lifetime or
not signed by this key starts a new session."""

from __future__ import annotations

import logging
import re
import time

import pytest
from itsdangerous import TimestampSigner

from tests.conftest import csrf_of, make_app, wait_for
from tests.support.chat_models import tiny_chat_model
from webapp.web.state import glassbox

DAY = 86400


@pytest.fixture
def app(tmp_path):
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat")}, torch_threads=1)
    yield app
    glassbox(app).core.shutdown()


def signed_at(app, data: dict, when: float) -> str:
    """A real session cookie, signed by the app's key as if the clock read `when`."""
    serializer = app.session_interface.get_signing_serializer(app)

    class At(TimestampSigner):
        def get_timestamp(self) -> int:
            return int(when)

    serializer.signer = At
    return serializer.dumps(data)


def a_browser_with_a_conversation(app):
    client = app.test_client()
    sent = client.post("/chat/send", data={"csrf_token": csrf_of(client, "/chat/"), "content": "remember me",
                                           "max_new_tokens": "2"}, headers={"HX-Request": "true"})
    assert sent.status_code == 200
    assert wait_for(lambda: glassbox(app).core.counters["done"] == 1)
    with client.session_transaction() as session:
        return dict(session)


def sees_its_conversation(app, cookie: str) -> bool:
    client = app.test_client()
    client.set_cookie("glassbox_session", cookie)
    page = client.get("/chat/")
    assert page.status_code == 200
    return "remember me" in page.get_data(as_text=True)


@pytest.mark.parametrize("ahead", [5, 3600, 3 * DAY])
def test_a_cookie_signed_ahead_of_the_clock_keeps_its_browser(app, ahead, caplog):
    data = a_browser_with_a_conversation(app)
    with caplog.at_level(logging.WARNING, logger="glassbox"):
        assert sees_its_conversation(app, signed_at(app, data, time.time() + ahead))
    logged = [r.getMessage() for r in caplog.records if "ahead of this server's clock" in r.getMessage()]
    assert bool(logged) == (ahead > 300)  # a few seconds of skew is not worth a line


def test_the_kept_cookie_is_signed_again_with_the_clock_s_time(app):
    data = a_browser_with_a_conversation(app)
    client = app.test_client()
    client.set_cookie("glassbox_session", signed_at(app, data, time.time() + 3 * DAY))
    response = client.get("/chat/")
    fresh = re.search(r"glassbox_session=([^;]+)", response.headers["Set-Cookie"]).group(1)
    _, when = app.session_interface.get_signing_serializer(app).loads(fresh, return_timestamp=True)
    assert abs(when.timestamp() - time.time()) < 60


def test_an_expired_cookie_or_another_key_s_cookie_starts_a_new_session(app, caplog):
    data = a_browser_with_a_conversation(app)
    with caplog.at_level(logging.WARNING, logger="glassbox"):
        assert not sees_its_conversation(app, signed_at(app, data, time.time() - 31 * DAY))
    assert any("past GLASSBOX_SESSION_DAYS" in r.getMessage() for r in caplog.records)
    forged = signed_at(app, data, time.time())
    assert not sees_its_conversation(app, forged[:-2] + ("AA" if not forged.endswith("AA") else "BB"))
    assert sees_its_conversation(app, signed_at(app, data, time.time()))


def session_cookie_set(app, cookie: str) -> bool:
    client = app.test_client()
    client.set_cookie("glassbox_session", cookie)
    response = client.get("/chat/")
    assert response.status_code == 200
    return any(v.startswith("glassbox_session=") for v in response.headers.getlist("Set-Cookie"))


def test_an_unchanged_cookie_is_signed_again_once_an_hour_old_not_on_every_answer(app):
    data = a_browser_with_a_conversation(app)
    assert not session_cookie_set(app, signed_at(app, data, time.time() - 60))
    assert session_cookie_set(app, signed_at(app, data, time.time() - 2 * 3600))
    assert sees_its_conversation(app, signed_at(app, data, time.time() - 2 * 3600))
