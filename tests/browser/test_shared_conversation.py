"""Issue 31, item 7 in Chromium: a newcomer opens a shared conversation (a fresh browser, no cookie) whose reply
has two versions, and reads it as the owner can: shading, Tokens with each token's odds, Prompt, Inside and
Compare, read-only, on a phone's 390 px without sideways scroll, axe-clean in both themes; 404 once unshared."""

from __future__ import annotations

import re

import pytest

from tests.browser.conftest import large_type, screenshot
from tests.browser.test_usability import axe, no_horizontal_scroll
from tests.support.servers import Gunicorn, model_env

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("shared31")
    env = {**model_env(work, chat_arch="tiny:0.01"), "GLASSBOX_MAX_NEW_TOKENS": "8"}
    app = Gunicorn(work / "instance", env).start()
    yield app
    app.stop()


def two_versions_shared(page) -> tuple[str, str]:
    """A reply, then a second version branched at its first token from another of the model's alternatives,
    shared read-only -> (the conversation's own address, the share link)."""
    page.goto("/chat/")
    page.fill("#content", "Hello")
    page.click("button.send")
    page.wait_for_selector("li.message.assistant.complete")
    conversation = page.url.split("#")[0]
    reply = page.locator("li.message.assistant").last.get_attribute("id").split("-")[1]
    page.goto(f"{conversation}/m/{reply}/tokens?t=0")
    page.get_by_role("button", name="Continue with this").first.click()  # a plain form: back once written
    page.wait_for_url(re.compile(r"/chat/c/[^/]+(#.*)?$"))
    page.wait_for_selector("li.message.assistant.complete .versions")
    assert page.locator("li.message.assistant .versions span").last.text_content() == "2/2"
    page.get_by_role("button", name="Share read-only").click()
    return conversation, page.locator("#share-url").input_value()


def check(page, conversation_id: str, name: str) -> None:
    """Read-only, through the share link only, fits 390 px, no serious or critical axe finding."""
    main = page.locator("main")
    assert main.locator("form").count() == 0 and main.locator("button").count() == 0, page.url
    assert conversation_id not in page.content(), page.url
    no_horizontal_scroll(page)
    assert axe(page) == [], page.url
    screenshot(page, f"issue31-shared-{name}")


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_a_newcomer_reads_a_shared_conversation_its_tokens_prompt_inside_and_both_versions(
        open_page, problems, scheme):
    problems.allow(404)
    owner = open_page()
    conversation, link = two_versions_shared(owner)
    conversation_id = conversation.rstrip("/").split("/")[-1]
    newcomer = open_page("phone", scheme)  # its own browser context: none of the owner's cookies
    assert newcomer.context.cookies() == []
    newcomer.goto(link)
    newcomer.locator("li.message.assistant summary").click()  # the shading, with its key
    newcomer.get_by_text("Hide tokens").wait_for()  # as the owner's Show tokens ↔ Hide tokens
    assert newcomer.get_by_text("Show tokens").is_hidden()
    assert newcomer.locator(".shared-tokens .token-view a.tok").count() == 8
    assert newcomer.locator(".shared-tokens .legend").is_visible()
    assert newcomer.get_by_text("version 2 of 2").is_visible()
    newcomer.locator(".model-card summary").click()  # what wrote the replies
    assert newcomer.locator(".model-card dt", has_text="Parameters").is_visible()
    check(newcomer, conversation_id, f"page-{scheme}")

    newcomer.get_by_role("link", name="Tokens", exact=True).click()
    newcomer.wait_for_url(re.compile(r"/chat/shared/[^/]+/m/\d+/tokens$"))
    assert newcomer.locator(".token-view a.tok").count() == 8
    newcomer.locator("#token-2").focus()  # htmx fetches the token's odds into the panel
    panel = newcomer.locator("#token-panel")
    panel.get_by_text("Token 3:").wait_for()
    assert panel.locator("table.alternatives meter").count() == 10 and panel.get_by_text("entropy").is_visible()
    check(newcomer, conversation_id, f"tokens-{scheme}")

    newcomer.get_by_role("link", name="The prompt it was given").click()
    newcomer.get_by_role("heading", name="The exact prompt this reply was given").wait_for()
    check(newcomer, conversation_id, f"prompt-{scheme}")
    newcomer.go_back()
    newcomer.locator("#token-2").click()  # without waiting for htmx: the link opens the panel too
    newcomer.locator("#token-panel").get_by_text("Token 3:").wait_for()
    newcomer.locator("#token-panel").get_by_role("link", name="Inside this token").click()
    newcomer.wait_for_url(re.compile(r"/chat/shared/[^/]+/m/\d+/inside/2$"))
    newcomer.wait_for_selector("table.lens")
    check(newcomer, conversation_id, f"inside-{scheme}")

    newcomer.goto(link)
    newcomer.get_by_role("link", name="Compare with version 1").click()
    newcomer.get_by_text("They differ from their first token on.").wait_for()
    assert newcomer.locator(".compare .token-panel").count() == 2
    check(newcomer, conversation_id, f"compare-{scheme}")
    newcomer.get_by_role("link", name="tokens", exact=True).last.click()  # the version not shown, through the link
    newcomer.wait_for_url(re.compile(r"/chat/shared/[^/]+/m/\d+/tokens$"))
    assert newcomer.locator(".token-view a.tok").count() == 8

    large = open_page(scheme=scheme)  # presentation mode, on a projector's 1366 px: large type, still clean
    large.goto(link)
    large_type(large)
    compare = large.get_by_role("link", name="Compare with version 1").get_attribute("href")
    shown = compare.split("/compare/")[0]
    for name, url in {"page": link, "tokens": f"{shown}/tokens?t=1", "prompt": f"{shown}/prompt",
                      "compare": compare}.items():
        large.goto(url)
        assert large.evaluate("() => document.documentElement.dataset.present") == "on"
        check(large, conversation_id, f"present-{name}-{scheme}")

    owner.goto(conversation)
    owner.get_by_role("button", name="Stop sharing").click()
    owner.get_by_role("button", name="Share read-only").wait_for()
    for url in (link, compare, f"{shown}/tokens?t=1", f"{shown}/inside/2", f"{shown}/prompt"):
        assert newcomer.goto(url).status == 404, url
    assert "stopped sharing" in newcomer.locator("main").text_content()
