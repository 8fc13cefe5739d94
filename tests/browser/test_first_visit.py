"""What a first-time user tripped on (issue 24), in Debian's Chromium with the fonts Debian installs beside
it: the player's controls draw their icons; a corrected Loop-lab run leaves no stale error; "Show tokens"
survives switching versions and looks pressed; an upload error comes into view with the focus, a too-large
file included; the Tokens page fits a phone and the top bar stays on one line; whitespace tokens have names;
the home cards are as tall as each other."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.browser.conftest import follow, screenshot
from tests.browser.test_chat import send
from tests.support.servers import Gunicorn, model_env

pytestmark = pytest.mark.browser


# The characters of an element's text that no installed font draws: measured on a canvas in the element's
# font, each against a private-use character that no font has (Chromium draws both as the same empty box).
UNDRAWN = """(selector) => {
  const el = document.querySelector(selector);
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = getComputedStyle(el).font;
  const box = ctx.measureText("\\uE000").width;
  const chars = [...new Set([...el.textContent].filter((c) => c.codePointAt(0) > 0x7f && c.trim()))];
  return {box, undrawn: chars.filter((c) => ctx.measureText(c).width === box),
          knownMissing: ctx.measureText("\\u23EE").width === box};
}"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("first-visit")
    env = {**model_env(work, chat_arch="tiny:0.01", loop_delay=0.01), "GLASSBOX_MAX_NEW_TOKENS": "8"}
    app = Gunicorn(work / "instance", env).start()
    yield app
    app.stop()


def run_loops(page, steps: str) -> None:
    page.fill("#steps", steps)
    page.click("#run")
    page.wait_for_selector("#summary", timeout=30_000)


def reply(page, text: str = "Hello") -> None:
    page.goto("/chat/")
    send(page, text)
    page.wait_for_selector("li.message.assistant.complete")


def box(page, selector: str) -> dict:
    return page.locator(selector).bounding_box()


# -- 4. the player's icons ---------------------------------------------------------------------------
def test_the_players_controls_draw_icons_every_font_has(open_page):
    page = open_page()
    page.goto("/loops/")
    run_loops(page, "6")
    seen = page.evaluate(UNDRAWN, ".player")
    assert seen["knownMissing"], "the check must see ⏮ as missing with these fonts, or it proves nothing"
    assert seen["undrawn"] == [], f"drawn as empty boxes: {seen['undrawn']}"
    for name in ("First", "Previous", "Next", "Last"):
        link = page.get_by_role("link", name=name, exact=True)
        icon = link.locator("svg.icon path")
        assert icon.count() == 1 and icon.get_attribute("d")
        size = link.locator("svg.icon").bounding_box()
        assert size["width"] >= 10 and size["height"] >= 10, (name, size)
    toggle = page.get_by_role("button", name="Play", exact=True)
    assert toggle.locator("svg.icon-play").is_visible() and not toggle.locator("svg.icon-pause").is_visible()
    page.select_option("#player-speed", "1")
    toggle.click()
    pause = page.get_by_role("button", name="Pause", exact=True)
    assert pause.get_attribute("aria-pressed") == "true"
    assert pause.locator("svg.icon-pause").is_visible() and not pause.locator("svg.icon-play").is_visible()
    screenshot(page, "first-visit-player")


# -- 5. a corrected run clears the error ------------------------------------------------------------
def test_a_corrected_run_leaves_no_stale_error(open_page, problems):
    problems.allow(400)
    page = open_page()
    page.goto("/loops/")
    page.fill("#steps", "0")
    page.click("#run")
    page.locator("#steps-error").wait_for()
    assert page.locator("#steps").get_attribute("aria-invalid") == "true"
    run_loops(page, "4")
    assert page.locator(".error").count() == 0
    assert page.locator("#steps").get_attribute("aria-invalid") is None
    assert page.locator("#steps").input_value() == "4"
    assert page.evaluate("() => document.activeElement.id") == "run"  # the keyboard stays on Run


# -- 6. Show tokens across versions -----------------------------------------------------------------
def test_show_tokens_survives_switching_versions_and_looks_pressed(open_page):
    page = open_page()
    reply(page)
    page.get_by_role("button", name="Regenerate").click()
    page.wait_for_function("() => document.querySelector('li.message.assistant .versions span')?.textContent === '2/2'")
    page.wait_for_selector("li.message.assistant.complete")
    toggle = page.locator("li.message.assistant .view-toggle button")
    off = page.evaluate("(b) => getComputedStyle(b).backgroundColor", toggle.element_handle())
    toggle.click()
    page.wait_for_selector("li.message.assistant .token-view")
    toggle = page.locator("li.message.assistant .view-toggle button")
    assert toggle.text_content() == "Hide tokens" and toggle.get_attribute("aria-pressed") is None
    on = page.evaluate("(b) => getComputedStyle(b).backgroundColor", toggle.element_handle())
    assert on != off, "a pressed Show tokens must look pressed"
    page.get_by_role("button", name="Previous version").click()
    page.wait_for_function("() => document.querySelector('li.message.assistant .versions span')?.textContent === '1/2'")
    assert page.locator("li.message.assistant .token-view").count() == 0  # version 1 was never switched
    page.get_by_role("button", name="Next version").click()
    page.wait_for_function("() => document.querySelector('li.message.assistant .versions span')?.textContent === '2/2'")
    assert page.locator("li.message.assistant .token-view a.tok").count() == 8  # no reload needed
    assert page.locator("li.message.assistant .view-toggle button").text_content() == "Hide tokens"


# -- 7. upload errors in view, with the focus --------------------------------------------------------
@pytest.mark.parametrize("upload, status, message", [
    (b"not json", 400, "That file is not JSON"),
    (json.dumps({"pad": "x" * 300_000}).encode(), 413, "That file is too large: the limit is 256 KiB."),
])
def test_an_upload_error_is_shown_in_view_with_the_focus_on_it(open_page, problems, upload, status, message):
    problems.allow(status)
    page = open_page()
    page.goto("/loops/")
    page.locator(".saved summary").click()
    page.set_input_files("#trace-file", files=[{"name": "trace.json", "mimeType": "application/json",
                                                "buffer": upload}])
    with page.expect_navigation() as answer:
        page.get_by_role("button", name="Upload and open").click()
    assert answer.value.status == status
    error = page.locator("#trace-file-error")
    assert message in error.text_content()
    # The browser runs autofocus (which scrolls) at its next rendering step, which may come after the load
    # event: wait for the focus and the error wholly in view, and say where they were if they never are.
    in_view = ("() => { const e = document.getElementById('trace-file-error'), r = e.getBoundingClientRect();"
               " return document.activeElement === e && r.top >= 0 && r.bottom <= innerHeight; }")
    try:
        page.wait_for_function(in_view, timeout=5_000)
    except PlaywrightTimeoutError:
        raise AssertionError(page.evaluate("() => [document.activeElement.id, scrollY, innerHeight,"
                                           " document.getElementById('trace-file-error').getBoundingClientRect()]"))
    assert page.locator("#editor").count() == 1  # the lab, not an error page
    screenshot(page, f"issue24-upload-{status}")


# -- 8. a phone: the Tokens page fits, the top bar stays on one line ---------------------------------
def test_at_390px_the_tokens_page_fits_and_the_top_bar_is_one_line(open_page):
    page = open_page("phone")
    reply(page)
    tokens_url = page.locator("li.message.assistant a.glass-link", has_text="Tokens").get_attribute("href")
    page.goto(tokens_url + "?t=2")
    widths = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], f"the page is {widths[0]}px wide in a {widths[1]}px window"
    scroller = page.evaluate("() => { const s = document.querySelector('#token-panel .table-scroll');"
                             " return [s.scrollWidth, s.clientWidth]; }")
    assert scroller[0] <= scroller[1], f"the alternatives scroll sideways: {scroller}"
    buttons = page.get_by_role("button", name="Continue with this")
    assert buttons.count() >= 5
    for i in range(buttons.count()):
        b = buttons.nth(i).bounding_box()
        assert b["x"] >= 0 and b["x"] + b["width"] <= widths[1], (i, b)
    theme, brand = box(page, ".theme-form button"), box(page, ".topbar .brand")
    line = page.evaluate("() => parseFloat(getComputedStyle(document.querySelector('.theme-form button')).lineHeight)"
                         " || 20")
    assert theme["height"] < 2 * line, f"the Theme button wraps: {theme}"
    assert abs((theme["y"] + theme["height"] / 2) - (brand["y"] + brand["height"] / 2)) < 8, (theme, brand)
    screenshot(page, "first-visit-tokens-phone")


# -- 9. whitespace tokens have names ------------------------------------------------------------------
def test_a_space_token_is_named_in_its_link_and_its_panel(open_page):
    page = open_page()
    reply(page)
    follow(page, page.locator("li.message.assistant a.glass-link", has_text="Tokens"))
    page.locator(".token-view a.tok").nth(2).focus()
    page.wait_for_function("() => document.querySelector('#token-panel h2')?.textContent.includes('Token 3')")
    page.fill("#token-panel-text", "a b")
    page.locator("#token-panel").get_by_role("button", name="Continue", exact=True).click()
    page.wait_for_url("**/chat/c/*")
    follow(page, page.locator("li.message.assistant a.glass-link", has_text="Tokens"))
    space = page.get_by_role("link", name="space: typed", exact=True)
    assert space.count() == 1
    space.focus()
    heading = page.locator("#token-panel h2")
    page.wait_for_function("() => document.querySelector('#token-panel h2')?.textContent.includes('Token 4')")
    assert "(space)" in heading.text_content()
    names = page.evaluate("() => [...document.querySelectorAll('.token-view a.tok')].map((a) => a.getAttribute("
                          "'aria-label'))")
    # every label is "<name>: <odds>" with a name: never blank ("…: 0.5%") nor led by a space (a sampled ":" token
    # is named ":", so its label "::" is fine)
    assert all(not n.startswith(" ") and not n.startswith(": ") for n in names), names


# -- 13. the home page's cards --------------------------------------------------------------------------
def test_the_home_cards_are_as_tall_as_each_other(open_page):
    page = open_page()
    page.goto("/")
    heights = [c.bounding_box()["height"] for c in page.locator(".cards a").all()]
    assert len(heights) == 2 and abs(heights[0] - heights[1]) < 1, heights
