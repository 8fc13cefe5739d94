"""Issue 32 in Debian's Chromium: a sweep of the two bundled checkpoints (the trained model and its early
checkpoint) fills in live as each k finishes, then shows the charts and the tables on which they disagree;
without JavaScript the page reloads itself until the sweep ends and renders it whole."""

from __future__ import annotations

import pytest

from tests.browser.conftest import screenshot
from tests.browser.test_usability import axe, no_horizontal_scroll
from tests.support.servers import ROOT, Gunicorn, model_env

pytestmark = pytest.mark.browser

# Each time the sweep's results change, how many k lines they show (recorded before any script of the page
# runs, so no change is missed however fast the lines come).
COUNT_LINES = """window.__lines = [];
new MutationObserver(() => {
  const n = document.querySelectorAll('#sweep-progress tr[data-k]').length;
  if (window.__lines[window.__lines.length - 1] !== n) window.__lines.push(n);
}).observe(document, {childList: true, subtree: true});"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The bundled loop model, and beside it (by default) its early checkpoint."""
    work = tmp_path_factory.mktemp("issue32")
    env = {**model_env(work, chat_arch="tiny:0.02"), "GLASSBOX_LOOP_MODEL": str(ROOT / "models" / "loops")}
    app = Gunicorn(work / "instance", env).start()
    yield app
    app.stop()


def start_sweep(page, k="32,64,128,192,256", tables="3"):
    page.goto("/loops/")
    page.locator("#sweep summary").click()
    page.select_option("#sweep-model", "main")
    page.select_option("#sweep-compare", "early")
    page.select_option("#sweep-family", "function")
    page.fill("#sweep-k", k)
    page.fill("#sweep-tables", tables)
    page.fill("#sweep-seed", "7")
    page.click("#sweep-run")


def test_a_sweep_of_both_checkpoints_fills_in_live_and_shows_where_the_early_one_fails(open_page):
    page = open_page()
    page.context.add_init_script(COUNT_LINES)
    start_sweep(page)
    page.wait_for_selector("#sweep-progress .sweep-status[data-done]", timeout=120_000)
    seen = page.evaluate("window.__lines")
    assert seen[-1] == 10                                    # 5 k × 2 models
    assert any(0 < n < 10 for n in seen), seen               # some lines were there before the last came
    columns = page.locator(".sweep-model")
    assert columns.count() == 2
    assert "Fully trained" in columns.nth(0).locator("h2").text_content()
    assert "Early checkpoint" in columns.nth(1).locator("h2").text_content()
    assert page.locator(".sweep-model svg").count() >= 5
    assert page.get_by_text("k (hops asked for)").count() == 2
    assert page.locator(".sweep-model").nth(1).locator("text=first wrong loop").count() >= 1
    # where the early one fails: tables on which they disagree, each opening as a trace
    assert page.locator("#disagreements").is_visible()
    assert page.locator(".sweep-disagree tbody tr").count() >= 1
    screenshot(page, "issue32-sweep")
    assert page.locator("#share").count() == 1  # saved: it can be shared
    assert not axe(page)
    phone = open_page(size="phone")
    phone.context.add_cookies(page.context.cookies())
    phone.goto(page.url)  # the live page of a finished sweep: its saved page
    phone.wait_for_selector(".sweep-status[data-done]")
    no_horizontal_scroll(phone)
    page.locator(".sweep-disagree button", has_text="Open as trace").first.click()
    page.wait_for_url("**/loops/traces/**")


def test_without_javascript_the_sweep_page_renders_whole_when_it_ends(open_page):
    page = open_page(js=False)
    start_sweep(page, k="8,64", tables="2")
    page.wait_for_url("**/loops/sweeps/*", timeout=60_000)  # the live page reloads itself until the end
    page.wait_for_selector(".sweep-status[data-done]", timeout=60_000)
    assert page.locator(".sweep-model svg").count() >= 4
    assert page.locator(".sweep-lines tbody tr").count() == 4


def test_compare_with_the_early_checkpoint_steps_both_players_together(open_page):
    from tests.browser.test_usability import run_loops
    page = open_page()
    run_loops(page, "40")
    page.select_option("#compare-model", "early")
    page.get_by_role("button", name="Run it there too").click()
    page.wait_for_url("**/loops/compare/**")
    assert page.locator(".compare-column").count() == 2
    first, second = page.locator("#player-1"), page.locator("#player-2")
    first.get_by_role("link", name="First").click()
    assert first.locator(".player-at").text_content() == "1" and second.locator(".player-at").text_content() == "1"
    first.get_by_role("link", name="Next", exact=True).click()
    second.get_by_role("link", name="Next", exact=True).click()
    assert first.locator(".player-at").text_content() == "3" and second.locator(".player-at").text_content() == "3"
    assert page.url.endswith("?loop=3")
    text = page.locator("#first-difference").text_content()
    if "first differ at" in text:  # where the early one goes its own way, marked in each table that has it
        assert page.locator("tr[data-first-difference]").count() == (1 if "had stopped" in text else 2)
    assert not axe(page)
    screenshot(page, "issue32-compare")


def test_a_follower_on_a_phone_watches_the_presenters_sweep_fill_in(open_page):
    """Issue 51: the presenter of a Loop lab opens a sweep; a follower's phone shows it below the status line,
    filling in, without sideways scrolling and with nothing to stop."""
    presenter = open_page()
    presenter.set_default_timeout(60_000)  # the sweep's runs are jobs on the core, behind any other test's
    presenter.goto("/loops/")
    presenter.click("#present button[type=submit]")
    link = presenter.locator("#present-url").input_value()
    follower = open_page("phone")
    follower.set_default_timeout(60_000)
    follower.goto(link)
    follower.wait_for_selector("#follow-status")
    start_sweep(presenter, k="4,8,16", tables="2")
    presenter.wait_for_url("**/loops/sweeps/**")
    follower.wait_for_selector("#presenter-view .sweep-results")
    assert "a sweep" in follower.locator("#follow-status").text_content()
    follower.wait_for_selector("#presenter-view .sweep-status[data-done]", timeout=120_000)
    assert follower.locator("#presenter-view .sweep-model").count() == 2
    assert follower.locator("#presenter-view form.sweep-stop").count() == 0
    no_horizontal_scroll(follower)
    screenshot(follower, "follow-sweep-phone")
