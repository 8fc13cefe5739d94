"""Issue 51, item 3, in Chromium: a projector that fits. In large type at 1280×720, 1280×800 and 1920×1080, every
page a presenter opens (a conversation, a reply's tokens, Inside, the lens, attribution, a patching map, two versions
compared, a sweep of steering strengths, a Loop-lab run and sweep; a feature's page: tests/browser/test_features.py)
is no wider than the screen, cuts no text off, fits its grid or map in its
width, and puts that grid or map in the first screen: the prose that explains it is folded behind "What am I
looking at?"."""

from __future__ import annotations

import re

import pytest

from tests.browser import test_room
from tests.browser.conftest import large_type, screenshot
from tests.browser.test_chat import send
from tests.browser.test_steering import make_direction
from tests.browser.test_usability import run_loops

pytestmark = pytest.mark.browser

PROJECTORS = {"720p": {"width": 1280, "height": 720}, "wxga": {"width": 1280, "height": 800},
              "1080p": {"width": 1920, "height": 1080}}

# Elements whose text is cut: clipped or ellipsised, and holding more than they show (1 px of rounding allowed).
CUT = """() => [...document.querySelectorAll('body *')].filter(e => {
    if (!e.offsetParent || !e.textContent.trim()) return false;
    if (e.closest('.table-scroll, details:not([open]), .visually-hidden')) return false;
    const s = getComputedStyle(e);
    const clips = s.textOverflow === 'ellipsis' || ['hidden', 'clip'].includes(s.overflowX);
    return clips && e.scrollWidth > e.clientWidth + 1;
  }).map(e => `${e.tagName.toLowerCase()}.${[...e.classList].join('.')}: ${e.textContent.trim().slice(0, 40)}`)"""

# The regions that scroll sideways (a grid or map wider than its column), with how much wider.
WIDE = """() => [...document.querySelectorAll('.table-scroll')].filter(e => e.offsetParent)
    .filter(e => e.scrollWidth > e.clientWidth + 1)
    .map(e => `${e.getAttribute('aria-label')}: ${e.scrollWidth} > ${e.clientWidth}`)"""


server = test_room.server  # issue 31's server: the tiny models, replies of 8 tokens at most


def presenter_pages(page) -> dict[str, tuple[str, str | None]]:
    """Each page a presenter opens -> (its URL, the selector of what it shows, to be in the first screen)."""
    page.goto("/chat/")
    send(page, "Where is France?", max_new_tokens="6")
    page.wait_for_selector("li.message.assistant.complete")
    chat = page.url
    reply = page.locator("li.message.assistant").last.get_attribute("id").split("-")[1]
    at = f"{chat}/m/{reply}"
    page.locator(f"#message-{reply}").get_by_role("button", name="Regenerate").click()  # a second version
    other = page.wait_for_selector(f"li.message.assistant.complete:not(#message-{reply})").get_attribute("id")
    make_direction(page)  # a direction to steer by, then a sweep of its strength on the reply
    page.goto(chat)
    steered = page.locator(f"#{other}")  # the version shown
    steered.locator("details.steer summary").click()
    steered.locator("form.steer-sweep").get_by_label("Direction").fill("cheer")
    steered.locator("form.steer-sweep").get_by_label("Strengths").fill("-30, 30, 0")
    steered.get_by_role("button", name="Sweep α").click()
    page.wait_for_url("**/sweep?v=**")
    page.wait_for_selector("#sweep:not([hx-get])")
    sweep = page.url
    run_loops(page, "12")
    page.wait_for_url(re.compile(r"/loops/traces/[^/?]+$"))
    loop_run = page.url
    page.goto("/loops/")
    page.locator("#sweep summary").click()
    page.fill("#sweep-k", "2,4")
    page.fill("#sweep-tables", "2")
    page.click("#sweep-run")
    page.wait_for_selector(".sweep-status[data-done]", timeout=60_000)
    return {"conversation": (chat, "li.message.assistant"), "tokens": (f"{at}/tokens?t=1", ".token-view"),
            "inside": (f"{at}/inside/1", "table"), "lens": (f"{at}/lens", "table.lens"),
            "attribution": (f"{at}/attribution/1", "ol.largest"),
            "patching": (f"{at}/patching/1?corrupted=Where+is+Jordan%3F&against=65", "table.patching-map"),
            "compare": (f"{chat}/m/{other.split('-')[1]}/compare/{reply}", ".compare"),
            "steer sweep": (sweep, "#sweep .side"),
            "loop run": (loop_run, "#results"), "loop sweep": (page.url, ".sweep-results")}


@pytest.mark.parametrize("projector", PROJECTORS)
def test_every_page_a_presenter_opens_fits_a_projector_in_large_type(open_page, problems, projector):
    setup = open_page()
    pages = presenter_pages(setup)
    large_type(setup)
    page = open_page()
    page.set_viewport_size(PROJECTORS[projector])
    page.context.add_cookies(setup.context.cookies())
    found: dict[str, list[str]] = {}
    for name, (url, shown) in pages.items():
        page.goto(url)
        page.wait_for_selector(shown)
        if name == "patching":  # the map worked out whole
            page.wait_for_function("() => document.querySelector('.run-status')?.textContent.includes('Done.')")
        problems_here = misfits(page, shown, PROJECTORS[projector])
        if problems_here:
            found[name] = problems_here
        if name in ("inside", "lens", "patching"):  # the prose is there, folded: a click opens it
            folded = page.locator("details.explain:not([open]) > summary", has_text="What am I looking at?")
            assert folded.count() >= 1, name
        screenshot(page, f"projector-{name}-{projector}")
    assert not found, found


def misfits(page, shown: str, screen: dict) -> list[str]:
    """What does not fit the screen on the page loaded: text cut off, a grid scrolling sideways, the page wider
    than the screen, `shown` (the page's grid or map) below the first screen."""
    page.wait_for_load_state()
    width = page.evaluate("() => document.documentElement.scrollWidth")
    cut, wide = page.evaluate(CUT), page.evaluate(WIDE)
    if width > screen["width"]:
        cut.append(f"the page is {width} px wide")
    top = page.evaluate(f"() => document.querySelector({shown!r}).getBoundingClientRect().top")
    below = [f"{shown} starts at {top:.0f} px, below the first screen"] if top > screen["height"] else []
    return cut + wide + below

def test_out_of_large_type_the_prose_is_open_and_folds_on_a_click(open_page):
    page = open_page()
    pages = presenter_pages(page)
    page.goto(pages["inside"][0])
    explain = page.locator("details.explain").first
    assert explain.get_attribute("open") is not None
    assert explain.locator("p").is_visible()
    explain.locator("summary").click()
    page.wait_for_function("() => !document.querySelector('details.explain').open")
    assert not explain.locator("p").is_visible()
