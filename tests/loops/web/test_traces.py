"""Issue 14 in the Loop lab, through the Flask test client: the player's server-rendered steps
(?loop=N), sharing a trace on purpose, the model picker, and a bad upload answered on the page."""

from __future__ import annotations

import re

import pytest

from tests.conftest import csrf_of, make_app
from tests.loops.web.test_lab import form, run_live
from webapp.web.state import glassbox


def saved_trace(client, csrf, **kw) -> str:
    final = run_live(client, csrf, **kw)[-1][1]
    return re.search(r'href="/loops/traces/([0-9a-f]+)">Private link', final).group(1)


def rows_of(html: str) -> list[str]:
    return re.findall(r"<tr( class=\"[^\"]*\")?>\s*<td>(\d+)</td>", html)


def test_a_finished_run_has_a_player_and_step_links_work_without_javascript(loop_app):
    client = loop_app.test_client()
    csrf = csrf_of(client, "/loops/")
    final = run_live(client, csrf, steps="5")[-1][1]
    assert 'class="player"' in final and 'id="player-loop"' in final  # right after the run, too
    trace_id = re.search(r'href="/loops/traces/([0-9a-f]+)">Private link', final).group(1)
    page = client.get(f"/loops/traces/{trace_id}?loop=3").get_data(as_text=True)
    classes = {int(n): c for c, n in rows_of(page)}
    assert 'class="current"' in classes[3] and all("ahead" in classes[n] for n in (4, 5))
    assert classes[1] == classes[2] == ""  # the loops up to the current one are shown as they are
    # the graph rings loop 3's predicted letter (the cycle: A -> B -> C -> D)
    assert re.search(r'<g class="node[^"]* current" data-symbol="D">', page)
    assert page.count(" current\" data-symbol=") == 1
    for name, loop in (("first", 1), ("prev", 2), ("next", 4), ("last", 5)):
        assert re.search(rf'data-to="{name}" href="/loops/traces/{trace_id}\?loop={loop}#player"', page), name
    assert 'value="3"' in re.search(r'<input type="range"[^>]+>', page).group(0)
    assert 'class="now-mark"' in page
    # out of range is clamped; no ?loop shows the whole run with the last loop current
    assert ("Loop <strong class=\"player-at\">5</strong> of 5"
            in client.get(f"/loops/traces/{trace_id}?loop=99").get_data(as_text=True))
    whole = client.get(f"/loops/traces/{trace_id}").get_data(as_text=True)
    assert "ahead" not in whole and 'aria-disabled="true">Next' in whole


def test_share_makes_a_read_only_link_anyone_can_open_until_it_is_revoked(loop_app):
    owner = loop_app.test_client()
    csrf = csrf_of(owner, "/loops/")
    trace_id = saved_trace(owner, csrf)
    page = owner.get(f"/loops/traces/{trace_id}").get_data(as_text=True)
    assert "Private link" in page and "opens only in this browser" in page and ">Share read-only</button>" in page
    stranger = loop_app.test_client()
    assert stranger.get(f"/loops/traces/{trace_id}").status_code == 404  # the private link stays private
    shared = owner.post(f"/loops/traces/{trace_id}/share", data={"csrf_token": csrf})
    assert shared.status_code == 303
    page = owner.get(f"/loops/traces/{trace_id}").get_data(as_text=True)
    url = re.search(r'id="share-url" type="text" readonly value="([^"]+)"', page).group(1)
    token = url.rsplit("/", 1)[1]
    assert len(token) >= 24 and trace_id not in token
    # sharing again gives the same link
    owner.post(f"/loops/traces/{trace_id}/share", data={"csrf_token": csrf})
    assert url in owner.get(f"/loops/traces/{trace_id}").get_data(as_text=True)
    seen = stranger.get(f"/loops/shared/{token}")
    html = seen.get_data(as_text=True)
    assert seen.status_code == 200 and "Shared Loop-lab trace" in html and 'class="player"' in html
    assert "Stop sharing" not in html and ">Share read-only</button>" not in html and 'id="editor"' not in html
    assert f'href="/loops/shared/{token}?loop=1#player"' in html  # its player stays on the shared page
    assert "ahead" in stranger.get(f"/loops/shared/{token}?loop=2").get_data(as_text=True)
    # only the owner can share or revoke
    other_csrf = csrf_of(stranger, "/loops/")
    assert stranger.post(f"/loops/traces/{trace_id}/share", data={"csrf_token": other_csrf}).status_code == 404
    assert stranger.post(f"/loops/traces/{trace_id}/unshare", data={"csrf_token": other_csrf}).status_code == 404
    assert stranger.get(f"/loops/shared/{token}").status_code == 200
    assert owner.post(f"/loops/traces/{trace_id}/unshare", data={"csrf_token": csrf}).status_code == 303
    gone = stranger.get(f"/loops/shared/{token}")
    assert gone.status_code == 404 and "stopped sharing" in gone.get_data(as_text=True)
    assert stranger.get("/loops/shared/not-a-token").status_code == 404


def test_a_bad_upload_is_answered_beside_the_upload_field(loop_app):
    from io import BytesIO
    client = loop_app.test_client()
    csrf = csrf_of(client, "/loops/")
    response = client.post("/loops/traces/upload", data={"csrf_token": csrf, "trace": (BytesIO(b"not json"), "t.json")},
                           content_type="multipart/form-data")
    html = response.get_data(as_text=True)
    assert response.status_code == 400
    assert 'id="trace-file-error"' in html and "That file is not JSON" in html
    assert re.search(r'<details class="saved" open', html) and 'id="editor"' in html


@pytest.fixture
def two_model_app(tmp_path, monkeypatch):
    from tests.support.loop_models import bundle
    monkeypatch.setenv("GLASSBOX_LOOP_EXTRA_MODELS", "early=tests.loops.early_model:load")
    app = make_app(tmp_path, {"loops": bundle()})
    yield app
    glassbox(app).core.shutdown()


def test_the_model_picker_runs_the_chosen_model_and_the_trace_records_it(two_model_app):
    client = two_model_app.test_client()
    page = client.get("/loops/").get_data(as_text=True)
    assert 'id="model"' in page and 'value="early"' in page and "Early checkpoint" in page
    cards = re.findall(r"<dt>([^<]+)</dt>\s*<dd>([\d,]+) parameters", page)  # the model card names both
    assert [label for label, _ in cards][1].startswith("Early checkpoint") and len(cards) == 2
    assert all(int(n.replace(",", "")) > 0 for _, n in cards)
    csrf = csrf_of(client, "/loops/")
    final = run_live(client, csrf, steps="6", model="early")[-1][1]
    assert "test:early" in final and "Not solved" in final  # it errs from loop 4 (tests/loops/early_model.py)
    trace_id = re.search(r'href="/loops/traces/([0-9a-f]+)">Private link', final).group(1)
    reopened = client.get(f"/loops/traces/{trace_id}").get_data(as_text=True)
    assert re.search(r'<option value="early" selected>', reopened)  # the editor comes back with its model
    assert "Solved" in run_live(client, csrf, steps="6", model="main")[-1][1]
    bad = client.post("/loops/run", data=form(csrf, model="nope"), headers={"HX-Request": "true"})
    assert bad.status_code == 400 and 'id="model-error"' in bad.get_data(as_text=True)


def test_one_model_has_no_picker(loop_app, monkeypatch):
    page = loop_app.test_client().get("/loops/").get_data(as_text=True)
    assert 'id="model"' not in page and 'name="model" value="main"' in page


def test_a_trace_and_a_conversation_are_shared_alike(chat_app):
    """The same control on both demos: a button with the same words while private; once shared, the link
    in a field to copy, a link to open it, and Stop sharing (the chat once gave a bare link, the trace a field)."""
    from tests.chat.web.test_conversations import send
    client = chat_app.test_client()
    csrf = csrf_of(client, "/loops/")
    trace_id = saved_trace(client, csrf)
    cid = send(client, "Share me", htmx=False, max_new_tokens="3").headers["Location"].rsplit("/", 1)[1]
    pages = {"trace": (f"/loops/traces/{trace_id}", f"/loops/traces/{trace_id}/share"),
             "conversation": (f"/chat/c/{cid}", f"/chat/c/{cid}/share")}
    boxes = {}
    for what, (page, share) in pages.items():
        private = client.get(page).get_data(as_text=True)
        assert ">Share read-only</button>" in private and "makes a read-only link anyone can open" in private
        assert "This page's address opens only in this browser" not in private
        assert client.post(share, data={"csrf_token": csrf}).status_code == 303
        shown = client.get(page).get_data(as_text=True)
        box = shown[shown.index('<div class="share" id="share">'):]
        box = box[:box.index("</form>")]
        url = re.search(r'<input id="share-url" type="text" readonly value="([^"]+)">', box).group(1)
        assert f"Read-only link: anyone who has it can open this {what}" in box and f'<a href="{url}">Open</a>' in box
        assert "Stop sharing" in box
        boxes[what] = re.sub(r'action="[^"]+"', "", box.replace(url, "URL").replace(what, "WHAT"))
    assert boxes["trace"] == boxes["conversation"]
