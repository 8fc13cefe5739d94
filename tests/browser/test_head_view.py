"""One head over a reply (query × key) in Debian's Chromium: reached from the Inside page's chosen head, with
and without JavaScript, the few-shot examples summed and then every position shown, axe-core with no serious
or critical violation in both themes and in presentation mode (labels at least 14 px), and no horizontal
scroll of the page at 390 px (the matrix scrolls in its own region)."""

from __future__ import annotations

import pytest

from tests.browser.conftest import large_type, screenshot
from tests.browser.test_chat import send
from tests.browser.test_usability import axe, no_horizontal_scroll

pytestmark = pytest.mark.browser


def test_one_head_over_the_reply_fits_a_phone_and_passes_axe_in_both_themes(open_page):
    page = open_page()
    page.goto("/chat/")
    send(page, "Which head reads what?", max_new_tokens="8")
    page.wait_for_selector("li.message.assistant.complete")
    tokens = page.get_by_role("link", name="Tokens").get_attribute("href")
    page.goto(tokens.split("?")[0].replace("/tokens", "/inside/6") + "?head=1.1#head")
    page.get_by_role("link", name="This head over the whole reply").click()
    page.wait_for_selector("table.qk")
    assert "Layer 1, head 1" in page.locator("h1").text_content()
    assert page.locator("table.qk tbody th[scope=row]").count() == 7  # the start marker, tokens 1..6
    assert "few-shot examples" in page.locator("table.qk thead").text_content()
    head_url = page.url.split("#")[0]
    screenshot(page, "head-desktop")
    cookies = page.context.cookies()

    plain = open_page("phone", js=False, cookies=cookies)  # no JavaScript: links all the way
    plain.goto(head_url.replace("/head/1.1", "?head=0.0"))
    plain.get_by_role("link", name="This head over the whole reply").click()
    assert "Layer 0, head 0" in plain.locator("h1").text_content()
    plain.get_by_role("link", name="Show every position").click()
    assert plain.locator("table.qk th.summed").count() == 0
    columns = plain.locator("table.qk thead th[scope=col]").count()
    assert columns == plain.locator("table.qk tbody tr").first.locator("td").count() > 200
    no_horizontal_scroll(plain)
    region = plain.locator(".qk-scroll")
    assert region.evaluate("e => e.scrollWidth > e.clientWidth")  # the matrix scrolls in its own region

    found = {}
    for scheme in ("light", "dark"):
        for url in (head_url, head_url + "?keys=all", head_url + "?rows=user"):
            viewer = open_page("phone", scheme, cookies=cookies)
            viewer.goto(url)
            no_horizontal_scroll(viewer)
            violations = axe(viewer)
            if violations:
                found[f"{scheme} {url}"] = violations
        screenshot(viewer, f"head-phone-{scheme}")
    assert not found, found

    page.goto(head_url)  # presentation mode: labels readable from the back of a room
    large_type(page)
    no_horizontal_scroll(page)
    assert not axe(page)
    sizes = page.evaluate("() => [...document.querySelectorAll('table.qk :is(th, th *)')]"
                          ".map(e => parseFloat(getComputedStyle(e).fontSize))")
    assert min(sizes) >= 14, sizes
    screenshot(page, "head-desktop-present")
