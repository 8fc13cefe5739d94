"""The logit lens over a whole reply in Debian's Chromium: reached from the reply's actions, a column per
token linking to Inside, the shading switched by a link (no JavaScript needed), and at 1366 px and at 390 px,
light and dark and in presentation mode: no sideways scroll of the page (the grid scrolls in its own region)
and no serious or critical axe-core violation."""

from __future__ import annotations

import pytest

from tests.browser.conftest import large_type, screenshot
from tests.browser.test_chat import send
from tests.browser.test_usability import axe, every_size_and_scheme, no_horizontal_scroll

pytestmark = pytest.mark.browser


def test_the_whole_reply_lens_from_a_reply_fits_a_phone_and_passes_axe(open_page):
    page = open_page()
    page.goto("/chat/")
    send(page, "Look through the lens", max_new_tokens="12")
    page.wait_for_selector("li.message.assistant.complete")
    page.locator("li.message.assistant").last.get_by_role("link", name="Logit lens").click()
    page.wait_for_selector("table.lens-grid")
    assert "through the logit lens" in page.locator("h1").text_content()
    assert page.locator("table.lens-grid thead th a").count() == 12  # a column per reply token
    assert page.locator("table.lens-grid tbody tr").count() == 3  # the tiny model: embeddings + 2 blocks
    lens_url = page.url
    page.get_by_role("link", name="the written token's probability at that layer").click()
    page.wait_for_url("**shade=written")
    assert page.locator(".legend-what").first.text_content().startswith("Cell shade: the written token's")
    page.locator("table.lens-grid thead th a").nth(2).click()
    page.wait_for_selector("table.lens")
    assert "Inside token 3" in page.locator("h1").text_content()
    cookies = page.context.cookies()

    plain = open_page(js=False)  # no JavaScript: the page is whole as it comes
    plain.context.add_cookies(cookies)
    plain.goto(lens_url)
    assert plain.locator("table.lens-grid tbody td.cell").count() == 3 * 12

    def grid_in_its_box(viewer):
        region = viewer.locator(".table-scroll[role=region]")
        assert region.evaluate("(e) => e.clientWidth <= document.documentElement.clientWidth")

    found = every_size_and_scheme(open_page, lens_url, cookies, "lens", check=grid_in_its_box)
    viewer = open_page()
    viewer.context.add_cookies(cookies)
    viewer.goto(lens_url)
    large_type(viewer)
    smallest = viewer.evaluate("""() => Math.min(...[...document.querySelectorAll('.lens-grid td, .lens-grid th')]
        .map((e) => parseFloat(getComputedStyle(e).fontSize)))""")
    assert smallest >= 18, smallest  # readable from the back of a room
    no_horizontal_scroll(viewer)
    found_present = axe(viewer)
    screenshot(viewer, "lens-present")
    large_type(viewer, on=False)  # the browser's session forgets it again
    assert not found and not found_present, (found, found_present)
