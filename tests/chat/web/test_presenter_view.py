"""Followers see what the presenter shows (issue 51, item 1): a view of a reply the presenter opens (its tokens,
Inside, a head, the lens, attribution) becomes the follow link's state, and the followers read it through the
follow link, read-only, from what the presenter's page worked out: never a job of their own."""

from __future__ import annotations

import re
from html import unescape

from tests.chat.web import test_glass
from tests.chat.web.test_glass import reply
from tests.chat.web.test_present import present
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
