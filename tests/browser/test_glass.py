"""The glass-box chat in a real browser: a reply's tokens and their odds, branching, versions, keyboard."""

from __future__ import annotations

import pytest

from tests.browser.conftest import follow, screenshot
from tests.browser.test_chat import send

pytestmark = pytest.mark.browser


def test_see_a_tokens_odds_branch_from_it_and_switch_versions(page):
    page.goto("/chat/")
    send(page, "Show me your odds", max_new_tokens="12")
    page.wait_for_selector("li.message.assistant.complete")
    follow(page, page.get_by_role("link", name="Tokens"))
    tokens = page.locator(".token-view a.tok")
    assert tokens.count() == 12

    tokens.nth(2).focus()  # the keyboard way: focus shows the panel
    page.wait_for_function("() => document.querySelector('#token-panel h2')?.textContent.includes('Token 3')")
    assert page.locator("#token-panel table.alternatives meter").count() == 10
    tokens.nth(5).hover()  # and so does the mouse
    page.wait_for_function("() => document.querySelector('#token-panel h2')?.textContent.includes('Token 6')")
    screenshot(page, "chat-tokens")

    page.locator("#token-panel").get_by_role("button", name="Continue with this").first.click()
    page.wait_for_url("**/chat/c/*")
    page.wait_for_selector("li.message.assistant.complete .versions")
    versions = page.locator("li.message.assistant .versions span")
    assert versions.text_content() == "2/2"
    page.get_by_role("button", name="Previous version").click()
    page.wait_for_function("() => document.querySelector('li.message.assistant .versions span')?.textContent === '1/2'")
    page.get_by_role("button", name="Next version").click()
    page.wait_for_function("() => document.querySelector('li.message.assistant .versions span')?.textContent === '2/2'")

    page.get_by_role("link", name="Compare with 1").click()
    assert "first differ at token 6" in page.locator("main").text_content()
    page.go_back()
    page.get_by_role("link", name="Prompt").click()
    assert page.locator(".part.reply_start").count() == 1 and page.locator(".part.fewshot").count() == 6
    screenshot(page, "chat-prompt")


def test_a_streaming_reply_can_show_its_tokens_live_and_stays_in_token_view(page):
    page.goto("/chat/")
    send(page, "Stream your tokens", max_new_tokens="25")
    pending = page.locator("li.message.assistant.pending")
    pending.get_by_role("button", name="Show tokens").click()
    page.wait_for_function("() => document.querySelector('li.message.pending.show-tokens .bubble .tok')")
    assert page.locator("li.message.assistant .view-toggle button").last.text_content() == "Hide tokens"
    shade = page.evaluate("() => getComputedStyle(document.querySelector('li.message.pending .bubble .tok'))"
                          ".borderTopStyle")
    assert shade == "solid"  # token boundaries drawn while it streams
    page.wait_for_selector("li.message.assistant.complete")
    done = page.locator("li.message.assistant.complete")
    assert done.locator(".token-view a.tok").count() == 25  # remembered: the finished reply shows its tokens
    assert done.get_by_role("button", name="Hide tokens").get_attribute("class") == "on"
