"""Presenting the Loop lab (issue 31): a follower sees a run's rows as they come, the trace the presenter
opens and the player's loop; revoking ends the stream and the link answers 404."""

import re

from tests.conftest import csrf_of, sse_events, wait_for
from tests.loops.web.test_lab import run_live
from tests.support.follower import Follower


def test_a_follower_sees_the_run_the_trace_and_the_player_then_revoke_ends_it(loop_app):
    client = loop_app.test_client()
    csrf = csrf_of(client, "/loops/")
    assert client.post("/loops/present", data={"csrf_token": csrf}).status_code == 303
    page = client.get("/loops/").get_data(as_text=True)
    link = re.search(r'value="http://localhost(/follow/[A-Za-z0-9_-]+)"', page).group(1)
    assert "data-presenting" in page and "present.js" in page

    follower = loop_app.test_client()
    page = follower.get(link)
    assert page.status_code == 200 and 'http-equiv="refresh"' in page.get_data(as_text=True).split("</head>")[0]
    following = Follower(follower, link + "/events")
    got, reader = following.got, following.reader
    assert wait_for(lambda: "event: player" in "".join(got))
    events = run_live(client, csrf, steps="6")
    trace_id = re.search(r"/loops/traces/([0-9a-f]+)", events[-1][1]).group(1)
    assert wait_for(lambda: "".join(d for n, d in sse_events("".join(got)) if n == "rows").count("<tr") == 6)
    assert wait_for(lambda: [n for n, _ in sse_events("".join(got))].count("run") == 2)  # live, then finished

    # the presenter's player (static/present.js reports it): the loop reaches the followers
    reported = client.post("/loops/present/state", data={"trace": trace_id, "loop": "3"},
                           headers={"X-CSRF-Token": csrf})
    assert reported.status_code == 204
    assert wait_for(lambda: "The presenter is at loop 3" in "".join(got))
    for odd in ("x", "\u00b2", "\u2460", "\u0663", "9" * 4301, "-1"):  # isdigit() said yes to ², ① and ٣ (a 500)
        refused = client.post("/loops/present/state", data={"loop": odd}, headers={"X-CSRF-Token": csrf})
        assert refused.status_code == 400 and "whole number" in refused.get_data(as_text=True), odd
    # a late joiner's page has the trace the presenter shows
    assert follower.get(link).get_data(as_text=True).count("<tr") == 7

    client.post("/loops/unpresent", data={"csrf_token": csrf})
    reader.join(5)
    assert not reader.is_alive() and sse_events("".join(got))[-1][0] == "done"
    assert follower.get(link).status_code == 404
    assert client.post("/loops/present/state", data={"loop": "1"}, headers={"X-CSRF-Token": csrf}).status_code == 404
