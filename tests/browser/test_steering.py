"""Steering in Debian's Chromium: a newcomer makes a direction from two lists of prompts on the Directions page,
sweeps a reply's strength from the Steer form under it, and lands on a page that fills in with a column per
strength beside the original; whole without JavaScript; at 1366 px and 390 px, light and dark: no sideways
scroll of the page and no serious or critical axe-core violation."""

from __future__ import annotations

import pytest

from tests.browser.conftest import screenshot
from tests.browser.test_chat import send
from tests.browser.test_usability import axe, every_size_and_scheme

pytestmark = pytest.mark.browser


def make_direction(page, name: str = "cheer") -> None:
    """A direction after block 1 from two short lists of prompts, made on the Directions page."""
    page.goto("/chat/directions")
    page.get_by_label("Name").first.fill(name)
    page.locator("#contrastive-layer").fill("1")
    page.get_by_label("Toward: one prompt a line").fill("Hello there\nHi, how are you?")
    page.get_by_label("Away from: one prompt a line").fill("Goodbye\nI am leaving now.")
    page.get_by_role("button", name="Make the direction").click()
    page.wait_for_selector(f"td:has-text('{name}')")


def test_sweep_a_replys_strength_and_read_the_versions_beside_the_original(open_page):
    page = open_page()
    make_direction(page)

    page.goto("/chat/")
    send(page, "Steer this reply", max_new_tokens="12")
    reply = page.locator("li.message.assistant.complete")
    reply.wait_for()
    reply.locator("details.steer summary").click()
    sweep = reply.locator("form.steer-sweep")
    sweep.get_by_label("Direction").fill("cheer")
    sweep.get_by_label("Strengths").fill("-30, 30, 0")
    sweep.get_by_role("button", name="Sweep α").click()
    page.wait_for_url("**/sweep?v=**")
    page.wait_for_selector("#sweep:not([hx-get])")  # every version has ended: the page asks no more
    assert page.locator("h1").text_content() == "Sweep α: cheer after block 1"
    headings = [h.strip().split("\n")[0].strip() for h in page.locator("#sweep h2").all_text_contents()]
    assert headings == ["Original", "α = -30", "α = 0", "α = 30"], headings
    statuses = page.locator("#sweep .sweep-status").all_text_contents()
    assert statuses[2].strip() == "The same as the original, token for token."  # α = 0 writes the reply again
    assert all(page.locator("#sweep .side").nth(i).locator(".tok").count() == 12 for i in range(4))
    screenshot(page, "steer-sweep")
    url, cookies = page.url, page.context.cookies()

    plain = open_page(js=False)  # no JavaScript: the page is whole once the versions have ended
    plain.context.add_cookies(cookies)
    plain.goto(url)
    assert plain.locator("#sweep .side").count() == 4 and "Writing" not in plain.locator("main").text_content()

    found = every_size_and_scheme(open_page, url, cookies, "steer-sweep")
    assert not found, found
    page.locator("#sweep .side").nth(3).get_by_role("link", name="compare").click()
    page.wait_for_selector(".compare .side")
    assert "steered: cheer ×30 after block 1" in page.locator("main").text_content()
    assert not axe(page)
