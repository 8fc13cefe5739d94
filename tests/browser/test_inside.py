"""Inside this token in Debian's Chromium: reached from a reply in two clicks (Tokens, then the panel's
"Inside this token"), a head chosen by its strip, without JavaScript too, and axe-core with no serious or
critical violation in both themes, at 1366 px and at 390 px, with no horizontal scroll (nor at 320 px)."""

from __future__ import annotations

import pytest

from tests.browser.conftest import screenshot
from tests.browser.test_chat import token_panel
from tests.browser.test_usability import every_size_and_scheme, no_horizontal_scroll

pytestmark = pytest.mark.browser


def test_inside_a_token_from_a_reply_with_and_without_javascript_passes_axe(open_page):
    page = open_page()
    token_panel(page, "Look inside", "6", 2)  # click 1: Tokens
    page.get_by_role("link", name="Inside this token").click()  # click 2
    page.wait_for_selector("table.lens")
    assert "Inside token 3" in page.locator("h1").text_content()
    assert page.locator("table.lens tbody tr").count() == 3  # the tiny model: embeddings + 2 blocks
    page.locator("a.strip").nth(3).click()  # block 1, head 1 (both from 0)
    page.wait_for_selector(".head-detail")
    assert "Layer 1, head 1" in page.locator(".head-detail h3").text_content()
    inside_url = page.url
    screenshot(page, "inside-desktop")
    cookies = page.context.cookies()

    plain = open_page(js=False, cookies=cookies)  # no JavaScript: links all the way
    plain.goto(inside_url.split("/inside/")[0] + "/tokens?t=1")
    plain.get_by_role("link", name="Inside this token").click()
    assert "Inside token 2" in plain.locator("h1").text_content()
    assert plain.locator("table.lens tbody tr").count() == 3

    found = every_size_and_scheme(open_page, inside_url, cookies, "inside")
    assert not found, found

    # WCAG's reflow width, 320 px: the chosen head's table scrolls in its own box, never the page
    narrow = open_page("phone", cookies=cookies)
    narrow.set_viewport_size({"width": 320, "height": 640})
    narrow.goto(inside_url)
    assert narrow.locator(".head-detail table.attended tbody tr").count() > 0
    no_horizontal_scroll(narrow)
