"""A presenting session (issue 51): one follow link for everything its presenter opens. The followers' page is the
page the presenter has open (a conversation, another, the Loop lab), and moves when the presenter does; Stop
presenting ends it. The same in Chromium: tests/browser/test_follow.py."""

import re
from html import unescape

from tests.chat.web.test_conversations import conversation_id_of, messages, send, stream_url
from tests.conftest import csrf_of, sse_events, wait_for
from tests.support.follower import Follower


def a_conversation(client, question: str) -> str:
    response = send(client, question, seed="1", max_new_tokens="4")
    client.get(stream_url(response.get_data(as_text=True))).get_data()
    return conversation_id_of(response)


def start_session(client, here: str) -> str:
    """Present from the page at `here` -> the session's follow link (its path)."""
    response = client.post("/present", data={"csrf_token": csrf_of(client, here), "next": here})
    assert response.status_code == 303 and response.headers["Location"].endswith(here)
    page = client.get(here).get_data(as_text=True)
    return re.search(r'value="http://localhost(/follow/[A-Za-z0-9_-]+)"', page).group(1)


def following(follower, link: str) -> tuple[str, Follower]:
    """The follower's page now, and its stream (the one its page opens)."""
    page = follower.get(link)
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    return html, Follower(follower, unescape(re.search(r'data-follow="([^"]+)"', html).group(1)))


def moved_to(stream: Follower, link: str) -> bool:
    """The stream said the presenter opened another page (and where the follower's page goes), and ended."""
    stream.reader.join(5)
    return not stream.reader.is_alive() and sse_events(stream.text)[-1] == ("moved", link)


def test_the_room_follows_the_presenter_from_a_conversation_to_the_loop_lab_and_another_conversation(chat_app):
    presenter, follower = chat_app.test_client(), chat_app.test_client()
    first = a_conversation(presenter, "The first question")
    second = a_conversation(presenter, "Another question")
    link = start_session(presenter, f"/chat/c/{first}")
    page = presenter.get(f"/chat/c/{first}").get_data(as_text=True)
    assert "Stop presenting" in page and "data-presenting-chat" in page  # the conversation's own link is made

    html, stream = following(follower, link)
    assert "The first question" in html and "Another question" not in html
    assert wait_for(lambda: "event: conversation" in stream.text)
    shown = re.search(r"shown=([A-Za-z0-9_-]+)", html).group(1)  # the link the session made for this page
    assert follower.get(f"/follow/{shown}").status_code == 200

    presenter.get("/loops/")  # the presenter opens the Loop lab
    assert moved_to(stream, link)
    assert follower.get(f"/follow/{shown}").status_code == 404  # the room keeps no way into a page it left
    html, stream = following(follower, link)
    assert "Loop lab, live" in html
    assert wait_for(lambda: "event: player" in stream.text)

    presenter.get(f"/chat/c/{second}")
    assert moved_to(stream, link)
    html, stream = following(follower, link)
    assert "Another question" in html and "The first question" not in html

    # a reply's view opened straight from an address moves the room to its conversation, with that view shown
    reply = messages(chat_app, first)[-1]
    assert presenter.get(f"/chat/c/{first}/m/{reply.id}/tokens").status_code == 200
    assert moved_to(stream, link)
    html, stream = following(follower, link)
    assert "The first question" in html and f"/m/{reply.id}/tokens" in html
    assert wait_for(lambda: "event: conversation" in stream.text)  # the stream is open before Stop

    # a follower looking around goes back to the session, not to the conversation's own link
    twin = re.search(r'data-view="([^"]+)"', html).group(1)
    assert f'href="{link}"' in follower.get(unescape(twin)).get_data(as_text=True)

    presenter.post("/present/stop", data={"csrf_token": csrf_of(presenter, "/"), "next": "/loops/"})
    stream.reader.join(5)
    assert not stream.reader.is_alive() and sse_events(stream.text)[-1][0] == "done"
    assert follower.get(link).status_code == 404
    page = presenter.get(f"/chat/c/{first}").get_data(as_text=True)
    assert "Stop presenting" not in page and "data-presenting-chat" not in page  # every link it showed is revoked


def test_when_the_page_shown_is_deleted_the_room_waits_for_the_next(chat_app):
    presenter, follower = chat_app.test_client(), chat_app.test_client()
    gone, cid = a_conversation(presenter, "Deleted soon"), a_conversation(presenter, "Shown later")
    link = start_session(presenter, f"/chat/c/{gone}")
    _, stream = following(follower, link)
    presenter.post(f"/chat/c/{gone}/delete", data={"csrf_token": csrf_of(presenter, "/")})
    assert moved_to(stream, link)
    html, stream = following(follower, link)
    assert "Waiting for the presenter" in html and "Deleted soon" not in html
    assert follower.get(f"/chat/c/{cid}").status_code == 404  # a follower opens nothing of the presenter's
    presenter.get(f"/chat/c/{cid}")
    assert moved_to(stream, link)
    html, stream = following(follower, link)
    assert "Shown later" in html
    presenter.post("/present/stop", data={"csrf_token": csrf_of(presenter, "/"), "next": "/"})
    stream.reader.join(5)
    assert not stream.reader.is_alive()  # the stream ends when the presenter stops


def test_a_page_rendered_before_the_presenter_moved_is_told_at_once(chat_app):
    presenter, follower = chat_app.test_client(), chat_app.test_client()
    cid = a_conversation(presenter, "Old news")
    link = start_session(presenter, f"/chat/c/{cid}")
    html = follower.get(link).get_data(as_text=True)
    stale = unescape(re.search(r'data-follow="([^"]+)"', html).group(1))
    presenter.get("/loops/")
    body = follower.get(stale).get_data(as_text=True)  # the stream of the page the follower still has
    assert sse_events(body) == [("moved", link)]


def test_present_goes_back_only_to_a_page_of_this_site(chat_app):
    client = chat_app.test_client()
    csrf = csrf_of(client, "/loops/")
    for elsewhere in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
        response = client.post("/present", data={"csrf_token": csrf, "next": elsewhere})
        assert response.status_code == 303 and response.headers["Location"] == "/", elsewhere
    assert client.post("/present", data={"csrf_token": csrf, "next": "/loops/\r\nX: y"}).status_code == 400


def test_a_link_to_one_conversation_outlives_the_sessions_visits_and_leads_back_to_itself(chat_app):
    """A "Present only this conversation" link made before the session is not the session's: shown by it, then
    left, it still shows that conversation, and a view opened through it leads back to it, not to the session."""
    presenter, follower = chat_app.test_client(), chat_app.test_client()
    cid = a_conversation(presenter, "Only this one")
    csrf = csrf_of(presenter, "/")
    assert presenter.post(f"/chat/c/{cid}/present", data={"csrf_token": csrf}).status_code == 303
    own = re.search(r'value="http://localhost(/follow/[A-Za-z0-9_-]+)"',
                    presenter.get(f"/chat/c/{cid}").get_data(as_text=True)).group(1)
    session = start_session(presenter, f"/chat/c/{cid}")
    assert session != own
    reply = messages(chat_app, cid)[-1]
    presenter.get(f"/chat/c/{cid}/m/{reply.id}/tokens")
    presenter.get("/loops/")  # the session moves on
    html = follower.get(own).get_data(as_text=True)
    assert "Only this one" in html
    twin = unescape(re.search(r'data-view="([^"]+)"', html).group(1))
    assert f'href="{own}"' in follower.get(twin).get_data(as_text=True)


def test_a_page_whose_link_was_revoked_under_the_session_is_shown_again_when_the_presenter_reopens_it(chat_app):
    presenter, follower = chat_app.test_client(), chat_app.test_client()
    cid = a_conversation(presenter, "Back again")
    link = start_session(presenter, f"/chat/c/{cid}")
    presenter.post(f"/chat/c/{cid}/unpresent", data={"csrf_token": csrf_of(presenter, "/")})  # a stale tab's
    html, stream = following(follower, link)
    assert "Waiting for the presenter" in html
    presenter.get(f"/chat/c/{cid}")
    assert moved_to(stream, link)
    html, stream = following(follower, link)
    assert "Back again" in html
    assert wait_for(lambda: "event: conversation" in stream.text)  # the stream is open before Stop
    presenter.post("/present/stop", data={"csrf_token": csrf_of(presenter, "/"), "next": "/"})
    stream.reader.join(5)
    assert not stream.reader.is_alive() and sse_events(stream.text)[-1][0] == "done"
