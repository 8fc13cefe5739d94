"""Follow links and replays in Chromium (issue 31): a follower's page shows the presenter's new message and
reply as they are written, and ends when the presenter stops presenting; Replay writes a reply again in place
at the chosen pace, and Stop puts it back."""

from __future__ import annotations

import pytest

from tests.browser.conftest import record, recorded, screenshot
from tests.browser.test_chat import send
from tests.browser.test_usability import axe

pytestmark = pytest.mark.browser


def presenting(open_context, question: str):
    """A new browser's conversation with one finished reply to `question`, presented -> (its page, the link)."""
    presenter = open_context().new_page()
    presenter.goto("/chat/")
    send(presenter, question, "5")
    presenter.wait_for_selector("li.message.assistant.complete, li.message.assistant.stopped")
    presenter.click("#present button[type=submit]")
    link = presenter.locator("#present-url").input_value()
    assert "/follow/" in link
    return presenter, link


def test_a_follower_page_updates_live_and_ends_on_revoke(open_context, problems):
    presenter, link = presenting(open_context, "First question")

    follower = open_context().new_page()  # another browser: no cookie of the presenter's
    follower.goto(link)
    follower.wait_for_selector("#follow-live li.message.user")
    record(follower, "reply", "() => document.querySelector('#follow-live .follow-text')?.textContent")
    send(presenter, "Second question, watched", "30")
    follower.wait_for_function("() => document.querySelector('#follow-live').textContent"
                               ".includes('Second question, watched')")
    presenter.wait_for_selector("li.message.assistant.complete >> nth=1")
    # then the finished reply, as the presenter's page shows it
    follower.wait_for_selector("#follow-live li.message.assistant:not(.pending) >> nth=1")
    seen = recorded(follower, "reply")
    assert len(seen) >= 3, seen  # the reply grew on the follower's page in several states, not only its end
    # 30 tokens at 60 ms each are written over 1.7 s at least: the follower sees them over most of it
    assert seen[-1][1] - seen[0][1] >= 0.5, seen
    screenshot(follower, "follow-chat")
    assert axe(follower) == [] and axe(presenter) == []  # the follower's page; the Present box and replay control

    presenter.click("#present button.danger")
    follower.wait_for_function("() => document.querySelector('#follow-status').textContent"
                               ".includes('stopped presenting')")
    problems.allow(404)  # the revoked link, opened again on purpose
    assert follower.goto(link).status == 404


def test_the_room_follows_the_presenter_across_pages_on_one_link(open_context, problems):
    """Issue 51: presenting is one session: the follower's phone shows the conversation, then the Loop lab when the
    presenter opens it, then the new conversation the presenter starts, on the same link, never scrolling sideways."""
    presenter, link = presenting(open_context, "Where do we start?")
    follower = open_context().new_page()
    follower.set_viewport_size({"width": 390, "height": 844})  # a follower's phone
    follower.goto(link)
    follower.wait_for_selector("#follow-live li.message.user:has-text('Where do we start?')")
    presenter.goto("/loops/")
    presenter.wait_for_selector("#present-url")  # the Loop lab's page says the room follows it too
    follower.wait_for_selector("h1:has-text('Loop lab, live')")
    assert follower.url == link
    assert follower.evaluate("() => document.documentElement.scrollWidth") <= follower.viewport_size["width"]
    presenter.goto("/chat/")
    send(presenter, "A new conversation, watched", "5")
    follower.wait_for_selector("#follow-live li.message.user:has-text('A new conversation, watched')")
    follower.wait_for_selector("#follow-live li.message.assistant:not(.pending)")
    assert follower.url == link and "Where do we start?" not in follower.locator("#follow-live").text_content()
    assert follower.evaluate("() => document.documentElement.scrollWidth") <= follower.viewport_size["width"]
    assert axe(follower) == []
    presenter.click("#present button.danger")
    follower.wait_for_function("() => document.querySelector('#follow-status').textContent"
                               ".includes('stopped presenting')")
    assert not problems


def test_replay_writes_the_reply_again_and_stop_puts_it_back(page):
    page.goto("/chat/")
    send(page, "Replay me", "20")
    page.wait_for_selector("li.message.assistant.complete, li.message.assistant.stopped")
    reply = page.locator("li.message.assistant").last
    before = reply.locator(".text").inner_text()
    reply.locator("select[name=pace]").select_option("5")
    reply.locator("form.replay button[type=submit]").click()
    page.wait_for_selector("li.message.assistant.replaying .replaying .tok")
    stop = reply.locator(".replay-stop")
    assert stop.is_visible()
    stop.focus()
    page.keyboard.press("Enter")  # by keyboard: the focus must not fall to <body> (issue 51)
    page.wait_for_function("() => !document.querySelector('li.replaying')")
    assert reply.locator(".text").inner_text() == before
    assert page.evaluate("() => document.activeElement.textContent") == "Replay"


def test_the_live_loop_table_follows_its_newest_row(page):
    page.goto("/loops/")
    page.fill("#steps", "40")  # 150 ms a loop here: 6 s of rows, far more than the table shows at once
    page.click("#run")
    page.wait_for_selector("#results .run-status")
    scroll = "#results .trace-scroll"
    page.wait_for_function(f"() => document.querySelectorAll('{scroll} tbody tr').length >= 25")
    # mid-run: the newest row is in sight, the table scrolled down to it
    assert page.evaluate(f"""() => {{
      const box = document.querySelector('{scroll}');
      const rows = box.querySelectorAll('tbody tr');
      const last = rows[rows.length - 1].getBoundingClientRect(), view = box.getBoundingClientRect();
      return box.scrollTop > 0 && last.bottom <= view.bottom + 2 && last.top >= view.top;
    }}""")
    page.wait_for_selector("#summary", timeout=30_000)


def test_a_follower_sees_the_view_the_presenter_opens_and_can_look_around_and_come_back(open_context, problems):
    """Issue 51: the presenter's Inside and lens, on the follower's screen as they open them."""
    presenter, link = presenting(open_context, "Where is France?")
    conversation = presenter.url
    reply = presenter.locator("li.message.assistant").last.get_attribute("id").split("-")[1]

    follower = open_context().new_page()  # another browser
    follower.goto(link)
    follower.wait_for_selector("#follow-live li.message.user")
    presenter.goto(f"{conversation}/m/{reply}/inside/1")
    follower.wait_for_selector("#presenter-view section.glass h1:has-text('Inside token 2')")
    assert follower.locator("#presenter-view table.lens tbody tr").count() >= 2
    assert "Inside token 2" in follower.locator("#follow-status").text_content()
    presenter.goto(f"{conversation}/m/{reply}/lens")
    follower.wait_for_selector("#presenter-view section.lens-page")
    assert follower.locator("#presenter-view section.glass").count() == 1  # the new view replaced the old
    screenshot(follower, "follow-presenter-view")
    assert axe(follower) == []

    follower.get_by_role("link", name="look around in it on your own").click()  # on their own, then back
    follower.wait_for_selector("section.lens-page")
    follower.get_by_role("link", name="← Back to the presenter").click()
    follower.wait_for_selector("#presenter-view section.lens-page")
    assert not problems


def test_a_follower_sees_the_patching_map_the_presenter_opens_read_only(open_context, problems):
    """Issue 51: a patching map on a follower's phone, with the question as the presenter edited it, nothing there
    to change or stop, and no sideways scrolling of the page (the map scrolls in its own region)."""
    presenter, link = presenting(open_context, "Where is France?")
    presenter.set_default_timeout(60_000)  # the map is a job on the core, behind any other test's work
    conversation = presenter.url
    reply = presenter.locator("li.message.assistant").last.get_attribute("id").split("-")[1]
    follower = open_context().new_page()
    follower.set_default_timeout(60_000)
    follower.set_viewport_size({"width": 390, "height": 844})  # a follower's phone
    follower.goto(link)
    follower.wait_for_selector("#follow-live li.message.user")
    presenter.goto(f"{conversation}/m/{reply}/patching/1")
    presenter.fill("#patching-corrupted", "Where is Norway?")
    presenter.click(".patching-form button[type=submit]")
    presenter.wait_for_selector("#patching-maps .run-status:has-text('Done.')")
    follower.wait_for_selector("#presenter-view #patching-maps .run-status:has-text('Done.')")
    assert "patching token 2" in follower.locator("#follow-status").text_content()
    assert follower.locator("#presenter-view blockquote.patching-question").text_content() == "Where is Norway?"
    assert follower.locator("#presenter-view table.patching-map td.pcell").count() > 0
    assert follower.locator("#presenter-view form").count() == 0  # no form, no Stop
    assert follower.evaluate("() => document.documentElement.scrollWidth") <= follower.viewport_size["width"]
    assert not problems


def test_a_follower_sees_the_presenters_replay_token_by_token_and_the_reply_put_back(open_context, problems):
    """Issue 51: while the presenter replays a reply, the follower's copy is written again token by token with
    it (not shown whole, as before), and put back whole when the replay ends."""
    presenter = open_context().new_page()
    presenter.goto("/chat/")
    send(presenter, "Replay this for the room", "20")
    presenter.wait_for_selector("li.message.assistant.complete, li.message.assistant.stopped")
    presenter.click("#present button[type=submit]")
    link = presenter.locator("#present-url").input_value()
    follower = open_context().new_page()
    follower.goto(link)
    follower.wait_for_selector("#follow-live li.message.assistant")
    whole = follower.locator("#follow-live li.message.assistant .text").inner_text()
    record(follower, "replayed", "() => document.querySelectorAll('#follow-live .follow-replay .tok').length")
    reply = presenter.locator("li.message.assistant").last
    reply.locator("select[name=pace]").select_option("10")
    reply.locator("form.replay button[type=submit]").click()
    presenter.wait_for_function("() => !document.querySelector('li.replaying')")
    follower.wait_for_function("() => !document.querySelector('#follow-live .follow-replay')")
    counts = [count for count, _ in recorded(follower, "replayed")]
    growing = counts[:counts.index(max(counts)) + 1]  # then 0: the replay's copy gone, the reply put back
    assert max(counts) >= 10 and len(growing) >= 3 and growing == sorted(growing), counts  # it grew, in steps
    assert follower.locator("#follow-live li.message.assistant .text").inner_text() == whole  # put back whole
    assert not problems
