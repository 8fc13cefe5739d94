"""Patch from another question in Debian's Chromium: from a reply's token panel, the form prefilled with the
question, then both heat maps filling in over SSE until every cell is there; without JavaScript the page
reloads itself to the same end."""

from __future__ import annotations

import time

import pytest

from tests.browser.conftest import REPORT_CSP, screenshot
from tests.browser.test_chat import token_panel
from tests.browser.test_usability import SIZES

pytestmark = pytest.mark.browser


def test_a_patching_map_fills_in_live_and_without_javascript(browser, server, problems):
    contexts = []

    def open_page(js=True, cookies=None):
        context = browser.new_context(base_url=server.url, viewport=SIZES["desktop"], java_script_enabled=js)
        context.add_init_script(REPORT_CSP)
        context.set_default_timeout(60_000)
        context.on("page", problems.watch)
        if cookies:
            context.add_cookies(cookies)
        contexts.append(context)
        return context.new_page()

    try:
        page = open_page()
        token_panel(page, "Where is France?", "4", 1)
        page.get_by_role("link", name="Patch from another question").click()
        assert page.locator("#patching-corrupted").input_value() == "Where is France?"
        page.fill("#patching-corrupted", "Where is Jordan?")
        page.get_by_role("button", name="Patch").click()
        page.wait_for_selector("table.patching-map")
        # the stream fills every cell, then replaces the section with the finished maps
        # the stream's last cells and its end arrive together: wait until both are on the page
        page.wait_for_function("() => document.querySelector('.run-status')?.textContent.includes('Done.')"
                               " && !document.querySelector('td.pcell.pending, td.pcell.est')")
        assert page.locator("table.patching-map").first.locator("td.pcell").count() > 0
        # every estimate was replaced by its exact cell, which names the estimate's error
        assert "mean error" in page.locator(".patching-estimate").text_content()
        assert "off by" in (page.locator("table.patching-map td.pcell").last.get_attribute("title") or "")
        assert "Clean: logit difference" in page.locator("#patching-values").text_content()
        screenshot(page, "patching-desktop")
        cookies, url = page.context.cookies(), page.url

        plain = open_page(js=False, cookies=cookies)  # kept: the same map at once, no script needed
        plain.goto(url)
        assert "Done." in plain.locator(".run-status").text_content()
        assert plain.locator("td.pcell.pending").count() == 0
        fresh = url.replace("Jordan", "Jordon")  # a new job: the page asks to be reloaded until it is done
        plain.goto(fresh)
        deadline = time.monotonic() + 60
        while "Done." not in plain.locator(".run-status").text_content():
            assert plain.locator('head noscript meta[http-equiv="refresh"]').count() == 1
            assert time.monotonic() < deadline
            plain.goto(fresh)  # as the refresh does (waiting for it races its navigation)
        assert plain.locator("td.pcell.pending, td.pcell.est").count() == 0
    finally:
        for context in contexts:
            context.close()
    assert not problems, problems
