"""The route cookie nginx hashes to keep a browser on one front end (deploy/nginx.conf): set with the
session, the same on every response and on every front end with the same secret key, while the session
cookie changes; nothing for a client that has no session."""

from __future__ import annotations

import re

from tests.conftest import make_app
from webapp.web.state import glassbox


def cookies(response) -> dict[str, str]:
    return dict(re.match(r"([^=]+)=([^;]*)", c).groups() for c in response.headers.getlist("Set-Cookie"))


def test_a_browser_keeps_one_route_on_every_front_end_while_its_session_cookie_changes(tmp_path):
    from tests.support.loop_models import bundle
    first = make_app(tmp_path / "a", {"loops": bundle()})
    other = make_app(tmp_path / "b", {"loops": bundle()})  # the same GLASSBOX_SECRET_KEY ("test-secret")
    try:
        client = first.test_client()
        made = cookies(client.get("/loops/"))
        route = made["glassbox_route"]
        assert re.fullmatch(r"[0-9a-f]{16}", route)
        again = client.get("/loops/")
        assert "glassbox_route" not in cookies(again)  # sent back unchanged: nothing to set
        assert client.get_cookie("glassbox_route").value == route
        session = client.get_cookie("glassbox_session").value
        moved = other.test_client()
        moved.set_cookie("glassbox_session", session)  # the same browser, on the other front end
        assert cookies(moved.get("/loops/"))["glassbox_route"] == route
        stranger = first.test_client()
        assert cookies(stranger.get("/loops/"))["glassbox_route"] != route  # another browser, another key
        assert "glassbox_route" not in cookies(first.test_client().get("/healthz"))  # no session, no route
    finally:
        glassbox(first).core.shutdown()
        glassbox(other).core.shutdown()
