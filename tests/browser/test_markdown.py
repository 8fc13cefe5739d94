"""A reply rendered as Markdown in a real browser: coloured code under the CSP, Copy buttons (only with
JavaScript), and a long code line that scrolls in its box instead of widening a phone's page."""

from __future__ import annotations

import pytest

from tests.browser.conftest import screenshot
from tests.support.servers import Gunicorn, model_env

pytestmark = pytest.mark.browser

CODE = 'greeting = "a line long enough to scroll sideways inside its own box on a phone, never the page"'
REPLY = f"## Plan\n\nUse **this**:\n\n```python\n{CODE}\n```"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Overrides conftest's: a model that always says REPLY."""
    work = tmp_path_factory.mktemp("markdown")
    app = Gunicorn(work / "instance", model_env(work, chat_arch="script:" + REPLY.encode().hex())).start()
    yield app
    app.stop()


def ask(page) -> object:
    page.goto("/chat/")
    page.fill("#content", "Show me")
    page.click("button.send")
    reply = page.locator("li.message.assistant.complete")
    reply.wait_for()
    return reply


def test_a_reply_renders_as_markdown_with_copy_buttons_and_fits_a_phone(open_context):
    context = open_context()
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    page = context.new_page()
    page.set_viewport_size({"width": 390, "height": 844})
    reply = ask(page)
    assert reply.locator(".markdown h3").text_content() == "Plan"
    assert reply.locator(".markdown strong").text_content() == "this"

    # Coloured by static/pygments.css (the CSP fixture fails the test on any inline style), per theme.
    string = reply.locator("pre.highlight .s2")
    assert string.evaluate("e => getComputedStyle(e).color") == "rgb(186, 33, 33)"  # 'default': #BA2121
    page.emulate_media(color_scheme="dark")
    assert string.evaluate("e => getComputedStyle(e).color") == "rgb(165, 214, 255)"  # 'github-dark': #A5D6FF
    page.emulate_media(color_scheme="light")

    # The long line scrolls inside its block; the page itself is no wider than the phone.
    assert reply.locator("pre").evaluate("e => e.scrollWidth > e.clientWidth")
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    screenshot(page, "chat-markdown-390")

    # One Copy button for the code block, one for the whole reply (its Markdown source), one per question.
    assert page.get_by_role("button", name="Copy").count() == 3
    reply.locator(".code-block").get_by_role("button", name="Copy").click()
    assert page.evaluate("() => navigator.clipboard.readText()") == CODE + "\n"
    reply.locator(".meta").get_by_role("button", name="Copy").click()
    assert page.evaluate("() => navigator.clipboard.readText()") == REPLY
    page.locator("li.message.user").get_by_role("button", name="Copy").click()
    for name in ("Copied", "Copy"):  # for a moment, then its name again
        page.wait_for_function(f"() => document.querySelector('li.message.user button.copy').textContent == '{name}'")
    assert page.evaluate("() => navigator.clipboard.readText()") == "Show me"


def test_without_javascript_the_reply_is_rendered_and_there_is_no_copy_button(browser, server):
    context = browser.new_context(base_url=server.url, java_script_enabled=False)
    try:
        page = context.new_page()
        reply = ask(page)
        assert reply.locator(".markdown h3").text_content() == "Plan"
        assert reply.locator("pre.highlight .s2").count() == 1
        assert page.locator("button.copy").count() == 0
    finally:
        context.close()
