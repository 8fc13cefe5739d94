"""Switch parts off in a real browser: a newcomer switches heads and MLPs off under a reply, watches the new
version arrive labelled, compares it with the original; and asks one position's odds from the token panel."""

from __future__ import annotations

import pytest

from tests.browser.conftest import follow, screenshot
from tests.browser.test_chat import send

pytestmark = pytest.mark.browser


def test_switch_parts_off_and_see_the_reply_change_beside_the_original(page):
    page.goto("/chat/")
    send(page, "Switch a head off", max_new_tokens="12")
    reply = page.locator("li.message.assistant.complete")
    reply.wait_for()
    reply.get_by_text("Switch parts off").click()
    reply.get_by_label("Heads").fill("0.0, 0.1, 1.0, 1.1")
    reply.get_by_label("MLPs").fill("0, 1")
    reply.get_by_role("button", name="Run again with them off").click()
    page.wait_for_function("() => document.querySelector('li.message.assistant .versions span')?.textContent === '2/2'")
    page.wait_for_selector("li.message.assistant.complete .badge.intervention")
    label = page.locator("li.message.assistant .badge.intervention").text_content()
    assert label == "heads 0.0, 0.1, 1.0, 1.1 and MLPs 0, 1 zeroed"
    screenshot(page, "chat-ablated-version")

    page.get_by_role("link", name="Compare with 1").click()
    main = page.locator("main").text_content()
    assert "first differ at token" in main or "differ from their first token" in main
    assert page.locator(".compare .side").count() == 2 and "MLPs 0, 1 zeroed" in main
    screenshot(page, "chat-ablated-compare")


def test_one_position_with_a_head_off_from_the_token_panel(page):
    page.goto("/chat/")
    send(page, "Odds without a head", max_new_tokens="6")
    page.wait_for_selector("li.message.assistant.complete")
    follow(page, page.get_by_role("link", name="Tokens"))
    page.locator(".token-view a.tok").nth(2).click()
    panel = page.locator("#token-panel")
    panel.get_by_text("This position with parts switched off").click()
    panel.get_by_label("Heads").fill("1.0")
    panel.get_by_role("button", name="Show the odds here with them off").click()
    page.wait_for_selector("#token-panel .ablated-odds")
    assert "Token 3 with head 1.0 zeroed" in panel.locator(".ablated-odds h3").text_content()
    assert panel.locator(".ablated-odds table.alternatives").count() == 2
    screenshot(page, "chat-ablated-position")


def test_a_part_the_model_does_not_have_is_said_beside_the_fields_which_keep_it(page, problems):
    problems.allow(400)  # the refusal is the answer
    page.goto("/chat/")
    send(page, "Switch a head off that is not there", max_new_tokens="6")
    reply = page.locator("li.message.assistant.complete")
    reply.wait_for()
    reply.get_by_text("Switch parts off").click()
    reply.get_by_label("Heads").fill("9.9")
    reply.get_by_role("button", name="Run again with them off").click()
    error = reply.locator("details.ablate[open] p.error[role=alert]")
    error.wait_for()
    assert "There is no head 9.9" in error.text_content()
    assert reply.get_by_label("Heads").input_value() == "9.9"  # what was typed, kept
    in_view = "(e) => { const r = e.getBoundingClientRect(); return r.top >= 0 && r.bottom <= innerHeight; }"
    assert error.evaluate(in_view)  # beside the fields, in view: not a banner scrolled away
    assert page.locator("li.message.assistant").count() == 1  # nothing was started
