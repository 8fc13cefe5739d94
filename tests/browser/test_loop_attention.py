"""Issue 20 in Debian's Chromium, with the bundled Loop-lab model: the player's "where the loop looked"
(the prompt shaded by attention, combined and per head) with and without JavaScript, on a phone and a
desktop, in both themes, with no serious axe violation and nothing widening the page."""

from __future__ import annotations

import pytest

from tests.browser.conftest import screenshot
from tests.browser.test_usability import SIZES, axe, no_horizontal_scroll, run_loops
from tests.support.servers import ROOT, Gunicorn, model_env

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The bundled loop model (it hands over its attention); the tiny chat model."""
    work = tmp_path_factory.mktemp("issue20")
    env = {**model_env(work, chat_arch="tiny:0.02"), "GLASSBOX_LOOP_MODEL": str(ROOT / "models" / "loops"),
           "GLASSBOX_LOOP_EXTRA_MODELS": ""}
    app = Gunicorn(work / "instance", env).start()
    yield app
    app.stop()


def test_the_player_shows_where_the_loop_looked_and_says_when_stepping_left_it_behind(open_page):
    page = open_page()
    run_loops(page, "6")
    trace_url = page.get_by_role("link", name="Private link").get_attribute("href")
    page.goto(trace_url + "?loop=3")
    panel = page.locator("#attention")
    assert "Where loop 3 looked" in panel.locator("h3").text_content()
    assert page.locator("#attention .prompt-strip").count() == 3            # combined, then two heads
    assert page.locator("#attention .prompt-strip.combined .pc").count() == 88
    assert page.locator("#attention .attention-stale").is_hidden()
    page.get_by_role("link", name="Next", exact=True).click()                        # steps in place
    assert page.locator(".player-at").text_content() == "4"
    assert "stale" in (panel.get_attribute("class") or "")
    note = page.locator("#attention .attention-stale")
    assert note.is_visible()
    note.get_by_role("link").click()
    page.wait_for_function("() => document.querySelector('#attention h3').textContent.includes('loop 4')")
    assert page.url.endswith("?loop=4#attention")
    assert "Where loop 4 looked" in page.locator("#attention h3").text_content()
    assert page.locator("#results td.read").first.text_content().startswith("A → ")
    screenshot(page, "issue20-attention")


def test_without_javascript_each_loop_has_its_own_attention(open_page):
    page = open_page()
    run_loops(page, "4")
    trace_url = page.get_by_role("link", name="Private link").get_attribute("href")
    plain = open_page(js=False)
    plain.context.add_cookies(page.context.cookies())
    plain.goto(trace_url + "?loop=2")
    assert "Where loop 2 looked" in plain.locator("#attention h3").text_content()
    plain.get_by_role("link", name="Next", exact=True).click()
    assert "Where loop 3 looked" in plain.locator("#attention h3").text_content()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_attention_view_passes_axe_and_fits_a_phone(open_page, scheme):
    setup = open_page()
    run_loops(setup, "5")
    trace_url = setup.get_by_role("link", name="Private link").get_attribute("href")
    found = {}
    for size in SIZES:
        page = open_page(size, scheme)
        page.context.add_cookies(setup.context.cookies())
        page.goto(trace_url + "?loop=2")
        assert page.locator("#attention .prompt-chars .pc").count() == 3 * 88
        no_horizontal_scroll(page)
        if size == "desktop":  # the whole prompt in view at once; a phone scrolls it
            fits = "(el => el.scrollWidth <= el.clientWidth)(document.querySelector('#attention .prompt-scroll'))"
            assert page.evaluate(fits)
        problems_here = axe(page)
        if problems_here:
            found[size] = problems_here
        screenshot(page, f"issue20-attention-{size}-{scheme}")
    assert not found, found
