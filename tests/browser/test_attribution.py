"""Who pushed this token in Debian's Chromium: reached from a reply's token panel, the grid and its legend
shown, another token chosen with the form, without JavaScript too, and axe-core with no serious or critical
violation in both themes, at 1366 px and at 390 px, with no horizontal scroll."""

from __future__ import annotations

import pytest

from tests.browser.conftest import screenshot
from tests.browser.test_chat import token_panel
from tests.browser.test_usability import every_size_and_scheme

pytestmark = pytest.mark.browser


def test_who_pushed_a_token_from_the_token_panel_with_and_without_javascript_passes_axe(open_page):
    page = open_page()
    token_panel(page, "Who pushed it", "6", 2)
    page.get_by_role("link", name="Who pushed this token").click()
    page.wait_for_selector("table.push-grid")
    assert "Who pushed token 3" in page.locator("h1").text_content()
    grid = page.locator("table.push-grid").first
    assert grid.locator("tbody tr").count() == 2  # the tiny model: 2 layers of 2 heads, and their MLPs
    assert grid.locator("tbody td").count() == 2 * 3
    assert page.locator(".push-legend").is_visible()
    assert "pushes up" in page.locator(".push-legend").text_content()
    assert page.locator("ol.largest li").count() == 8  # 4 heads, 2 MLPs, the embeddings, the biases
    assert "The 8 that pushed hardest" in page.locator("#largest").text_content()
    page.locator("select#against").select_option(index=1)
    page.get_by_role("button", name="Split").click()
    page.wait_for_selector("text=minus that of")
    attribution_url = page.url
    screenshot(page, "attribution-desktop")
    cookies = page.context.cookies()

    plain = open_page(js=False, cookies=cookies)  # no JavaScript: links and a GET form
    plain.goto(attribution_url.split("/attribution/")[0] + "/tokens?t=1")
    plain.get_by_role("link", name="Who pushed this token").click()
    assert "Who pushed token 2" in plain.locator("h1").text_content()
    assert plain.locator("table.push-grid").first.locator("tbody tr").count() == 2

    found = every_size_and_scheme(open_page, attribution_url, cookies, "attribution")
    assert not found, found
