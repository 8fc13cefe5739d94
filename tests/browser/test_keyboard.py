"""Both pages with the keyboard alone: Tab (and Shift+Tab) reach every control, Enter and Space
operate them, and the focus stays where the reader is after a control re-renders its part of the page."""

from __future__ import annotations

import pytest

from tests.browser.conftest import record, recorded, screenshot

pytestmark = pytest.mark.browser

PENDING = "li.message.assistant.pending"


def tab_to(page, selector: str, *, backwards: bool = False, limit: int = 120) -> None:
    """Press Tab until the focused element matches `selector`; fails if it is never reached."""
    for _ in range(limit):
        if page.evaluate("(s) => !!document.activeElement && document.activeElement.matches(s)", selector):
            return
        page.keyboard.press("Shift+Tab" if backwards else "Tab")
    raise AssertionError(f"Tab never reached {selector}")


def focused(page) -> str:
    return page.evaluate("() => document.activeElement.outerHTML.slice(0, 120)")


def test_chat_by_keyboard_send_stop_regenerate_and_edit(page):
    page.goto("/chat/")
    assert page.evaluate("() => document.activeElement.id") == "content"  # autofocus: type at once
    tab_to(page, "#content")
    page.keyboard.type("Typed without a mouse")
    page.keyboard.press("Enter")  # Enter sends
    page.wait_for_selector(PENDING)
    assert page.evaluate("() => document.activeElement.id") == "content"  # ready for the next message

    # Where the focus is each time the page changes once the reply is stopped: never on <body>, not even
    # for the moment between the swap that removes the Stop button and htmx's settle.
    record(page, "focus once stopped", "() => document.querySelector('li.message.assistant.stopped')"
                                       " && (document.activeElement.id || document.activeElement.tagName)")
    tab_to(page, f"{PENDING} button.stop", backwards=True)
    page.keyboard.press("Space")
    page.wait_for_selector("li.message.assistant.stopped")
    assert [where for where, _ in recorded(page, "focus once stopped")] == ["content"], focused(page)  # not lost

    tab_to(page, "li.message.assistant button", backwards=True)  # Regenerate
    assert page.evaluate("() => document.activeElement.textContent") == "Regenerate"
    page.keyboard.press("Enter")
    # the new version may be written before a look could find it streaming: wait for it to exist, then to end
    page.wait_for_function("() => document.querySelector('li.message.assistant .versions span')?.textContent"
                           " === '2/2'")
    page.wait_for_selector(PENDING, state="detached", timeout=20_000)

    tab_to(page, "li.message.user details.edit summary", backwards=True)
    page.keyboard.press("Enter")  # opens the editor
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.tagName") == "TEXTAREA"
    page.keyboard.press("Control+A")
    page.keyboard.type("Edited by keyboard")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.textContent") == "Save and resend"
    page.keyboard.press("Space")
    page.wait_for_function("() => document.querySelector('li.message.user .text').textContent"
                           " === 'Edited by keyboard'")
    page.wait_for_selector(PENDING, state="detached", timeout=20_000)
    screenshot(page, "chat-keyboard")


def test_loop_lab_by_keyboard_presets_reorder_and_run(page):
    page.goto("/loops/")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("() => document.activeElement.id") == "main"
    tab_to(page, "button[value='preset:identity']")
    page.keyboard.press("Space")
    page.wait_for_function("() => document.querySelector('#dst-1').value === 'B'")
    assert page.evaluate("() => document.activeElement.value") == "preset:identity", focused(page)

    tab_to(page, "#dst-0")
    page.keyboard.press("ArrowDown")  # the select's next option: A -> B
    assert page.locator("#dst-0").input_value() == "B"
    tab_to(page, "button[value='down:0']")
    page.keyboard.press("Enter")  # the rule A -> B moves down a place
    page.wait_for_function("() => document.querySelectorAll('input[name=src]')[1].value === 'A'")
    focused_rule = page.evaluate("() => document.activeElement.getAttribute('aria-label')")
    assert focused_rule == "Move rule A down", focused(page)  # still on the rule that moved

    tab_to(page, "#steps", backwards=True)
    page.keyboard.press("Control+A")
    page.keyboard.type("3")
    page.keyboard.press("Enter")  # Enter in a field submits the form: Run
    page.wait_for_selector("#summary", timeout=20_000)
    assert page.locator("#results tbody tr").count() == 3
    tab_to(page, "#results a")  # the results' links are in the tab order too
    screenshot(page, "loops-keyboard")


def test_the_home_page_leads_to_both_demos(page):
    page.goto("/")
    screenshot(page, "home")
    tab_to(page, "main a[href='/chat/']")
    page.keyboard.press("Enter")
    page.wait_for_url("**/chat/")
    page.go_back()
    tab_to(page, "main a[href='/loops/']")
    page.keyboard.press("Enter")
    page.wait_for_url("**/loops/")
