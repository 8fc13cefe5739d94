"""Followers see what the presenter shows (issue 51, item 1): a view of a reply the presenter opens (its tokens,
Inside, a head, the lens, attribution) becomes the follow link's state, and the followers read it through the
follow link, read-only, from what the presenter's page worked out: never a job of their own."""

from __future__ import annotations

import re
from html import unescape

from tests.chat.web import test_glass
from tests.chat.web.test_glass import reply
from tests.chat.web.test_present import present
from tests.conftest import wait_for
from webapp.core.jobs import DONE
from webapp.web.state import glassbox

chat_app = test_glass.chat_app  # the tiny byte-level model, made to never stop before max_new_tokens


def state_of(app, link: str) -> dict:
    with app.app_context():
        from webapp.web import follow
        found = follow.links().get(link.rsplit("/", 1)[1])
    assert found is not None
    return found.state


def jobs(app, kind: str) -> int:
    return sum(j.kind == kind for j in glassbox(app).core._jobs.values())


def test_the_views_the_presenter_opens_are_shown_to_the_followers_and_never_worked_out_for_them(chat_app):
    presenter, follower = chat_app.test_client(), chat_app.test_client()
    cid, mid, _ = reply(presenter, "Where is France?", max_new_tokens="4", temperature="0")
    assert presenter.get(f"/chat/c/{cid}/m/{mid}/inside/1").status_code == 200  # not presented: nothing kept
    link = present(presenter, cid)
    token = link.rsplit("/", 1)[1]
    for path, label in (("inside/2?head=1.0", "Inside token 3"), ("lens", "the reply through the logit lens"),
                        ("attribution/1", "who pushed token 2"), ("tokens?t=3", "the reply's tokens")):
        assert presenter.get(f"/chat/c/{cid}/m/{mid}/{path}").status_code == 200
        assert state_of(chat_app, link) == {"view": "page", "message": str(mid), "path": path, "label": label}
        page = unescape(follower.get(link).get_data(as_text=True))  # the follower's page says it, and where
        twin = f"/chat/shared/{token}/m/{mid}/{path}"
        assert f"The presenter is showing <strong>{label}</strong>" in page and f'data-view="{twin}"' in page
        before = len(glassbox(chat_app).core._jobs)
        shown = follower.get(twin)
        assert shown.status_code == 200, (path, shown.get_data(as_text=True)[:300])
        assert len(glassbox(chat_app).core._jobs) == before  # read from the presenter's report: no job
        assert "Back to the presenter" in shown.get_data(as_text=True)
    # a view the presenter never opened: the follower waits for it, and starts nothing
    inside_jobs = jobs(chat_app, "inside")
    unseen = follower.get(f"/chat/shared/{token}/m/{mid}/inside/0")
    assert unseen.status_code == 409 and "has not opened this yet" in unescape(unseen.get_data(as_text=True))
    assert jobs(chat_app, "inside") == inside_jobs
    # an error page of the presenter's is not shown to the room
    assert presenter.get(f"/chat/c/{cid}/m/{mid}/inside/99").status_code == 404
    assert state_of(chat_app, link)["path"] == "tokens?t=3"
    # revoked: the views close with the link
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', presenter.get(f"/chat/c/{cid}").get_data(as_text=True))[1]
    presenter.post(f"/chat/c/{cid}/unpresent", data={"csrf_token": csrf})
    assert follower.get(f"/chat/shared/{token}/m/{mid}/tokens?t=3").status_code == 404


def test_only_the_owner_of_a_presented_conversation_moves_its_followers(chat_app):
    owner, other = chat_app.test_client(), chat_app.test_client()
    cid, mid, _ = reply(owner, "Where is France?", max_new_tokens="3", temperature="0")
    link = present(owner, cid)
    assert other.get(f"/chat/c/{cid}/m/{mid}/inside/1").status_code == 404
    assert state_of(chat_app, link) == {}


def test_a_patching_map_the_presenter_opens_fills_in_for_the_followers_who_never_start_or_stop_it(chat_app):
    """The map's twin is reached by a short name (the edited message may be longer than a follow link's state
    holds); it follows the presenter's job read-only: no form, no Stop, and a follower leaving its stream never
    cancels the presenter's map."""
    from tests.chat.patching.test_pages import Held
    core = glassbox(chat_app).core
    core.executors["patching"].batch_tokens = 1
    presenter, follower = chat_app.test_client(), chat_app.test_client()
    cid, mid, _ = reply(presenter, "Where is France?", max_new_tokens="3", temperature="0")
    other_cid, other_mid, _ = reply(presenter, "Where is France?", max_new_tokens="3", temperature="0")
    token = present(presenter, cid).rsplit("/", 1)[1]
    query = {"corrupted": "Where is Jordan?", "against": "65"}
    held = Held(core)
    try:
        assert presenter.get(f"/chat/c/{cid}/m/{mid}/patching/1", query_string=query).status_code == 200
        state = state_of(chat_app, f"/follow/{token}")
        assert state["label"] == "patching token 2" and re.fullmatch(r"patching/1/[0-9a-f]{16}", state["path"])
        job = next(j for j in core._jobs.values() if j.kind == "patching")
        assert wait_for(lambda: any(e.name == "cells" for e in job.events), timeout=60)
        twin = f"/chat/shared/{token}/m/{mid}/{state['path']}"
        before = len(core._jobs)
        page = follower.get(twin)
        html = unescape(page.get_data(as_text=True))
        assert page.status_code == 200 and len(core._jobs) == before
        assert '<blockquote class="patching-question">Where is Jordan?</blockquote>' in html
        assert "patching-form" not in html and "/stop/" not in html  # read-only: nothing to change or stop
        stream = re.search(r'sse-connect="([^"]+)"', html).group(1)
        assert stream == f"{twin}/stream"
        left = follower.get(stream, buffered=False)  # a follower opens the live map, and leaves
        assert next(left.response).startswith(b": open")
        left.close()
        assert not job.finished_state and not job.cancelled
        # the name opens that map of that reply only
        assert follower.get(f"/chat/shared/{token}/m/{mid}/patching/1/{'0' * 16}").status_code == 404
        assert follower.get(f"/chat/shared/{token}/m/{mid}/patching/2/{state['path'][-16:]}").status_code == 404
        assert presenter.get(f"/chat/c/{other_cid}/m/{other_mid}/patching/1",
                             query_string=query).status_code == 200  # the same request on another reply
        assert follower.get(f"/chat/shared/{token}/m/{other_mid}/{state['path']}").status_code == 404
    finally:
        held.release()
    events = follower.get(stream).get_data(as_text=True)  # the rest of the map, then the whole of it
    assert "event: cells" in events and events.count("event: done") == 1 and "Done." in events
    assert job.state == DONE
    done = follower.get(twin).get_data(as_text=True)
    assert "Done." in done and "sse-connect" not in done and 'class="pcell pending"' not in done


def test_two_versions_the_presenter_compares_are_compared_on_the_followers_screens(chat_app):
    """Issue 51: an ablated, steered or branched version beside the reply, as the presenter compares them."""
    from tests.conftest import csrf_of
    from webapp.chat.web.conversations import service
    presenter, follower = chat_app.test_client(), chat_app.test_client()
    cid, mid, _ = reply(presenter, "Compare us", max_new_tokens="10", temperature="1.0", top_k="0", seed="11")
    with chat_app.app_context():
        rows = service().store.details(mid).odds
    other = next(t for t, _, _ in rows[3][5] if t != rows[3][0])
    presenter.post(f"/chat/c/{cid}/m/{mid}/branch",
                   data={"csrf_token": csrf_of(presenter, f"/chat/c/{cid}"), "index": "3", "token": str(other)})
    with chat_app.app_context():
        new = service().store.messages(cid)[-1]
    link = present(presenter, cid)
    assert presenter.get(f"/chat/c/{cid}/m/{new.id}/compare/{mid}").status_code == 200
    assert state_of(chat_app, link) == {"view": "page", "message": str(new.id), "path": f"compare/{mid}",
                                        "label": "two versions side by side"}
    twin = follower.get(f"/chat/shared/{link.rsplit('/', 1)[1]}/m/{new.id}/compare/{mid}")
    assert twin.status_code == 200 and "first differ at token 4" in twin.get_data(as_text=True)
