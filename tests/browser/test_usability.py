"""Issue 14 in Debian's Chromium at 1366x768 and 390x844, light and dark: the sampling form keeps
what was typed, the Loop-lab player (with and without JavaScript), sharing, the model picker, no
horizontal page scroll, touch targets, the theme toggle, and axe-core on every page in both themes."""

from __future__ import annotations

import re

import pytest

from tests.browser.conftest import SIZES, large_type, record, recorded, screenshot
from tests.browser.test_chat import send, set_reply_length
from tests.support.servers import ROOT, Gunicorn, model_env

pytestmark = pytest.mark.browser

AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
ROWS = "#results tbody tr"
VISIBLE_ROWS = "#results tbody tr:not(.ahead)"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Loops at 20 ms each; a second, scripted 'early' model that errs from loop 4 on."""
    work = tmp_path_factory.mktemp("issue14")
    env = {**model_env(work, chat_arch="tiny:0.02", loop_delay=0.02), "GLASSBOX_MAX_NEW_TOKENS": "8",
           "GLASSBOX_LOOP_EXTRA_MODELS": "early=tests.loops.early_model:load"}
    app = Gunicorn(work / "instance", env).start()
    yield app
    app.stop()


def run_loops(page, steps: str, model: str | None = None) -> None:
    page.goto("/loops/")
    page.fill("#steps", steps)
    if model:
        page.select_option("#model", model)
    page.click("#run")
    page.wait_for_selector("#summary", timeout=30_000)


def no_horizontal_scroll(page) -> None:
    page.wait_for_load_state()  # after a click that navigates, the stylesheets too
    widths = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], f"{page.url}: the page is {widths[0]}px wide in a {widths[1]}px window"


def axe(page) -> list[str]:
    if not AXE.exists():
        from tests.browser.conftest import _unavailable
        _unavailable(f"{AXE} is missing (npm ci installs axe-core, a devDependency in package.json)")
    page.wait_for_load_state()  # contrast and sizes as styled, not as first parsed
    page.evaluate(AXE.read_text())  # evaluated, not a <script>: the page's CSP stays as it is
    result = page.evaluate("() => axe.run(document, {resultTypes: ['violations']})")
    return [f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes']][:3]}"
            for v in result["violations"] if v["impact"] in ("serious", "critical")]


def every_size_and_scheme(open_page, url: str, cookies, name: str, check=None) -> dict[str, list[str]]:
    """`url` at every size of SIZES in both colour schemes, each page its own context with `cookies`: no
    horizontal scroll, `check(page)` where given, a screenshot (name-size-scheme); returns axe's serious and
    critical violations by "size scheme" (empty: none)."""
    found = {}
    for size in SIZES:
        for scheme in ("light", "dark"):
            page = open_page(size, scheme, cookies=cookies)
            page.goto(url)
            no_horizontal_scroll(page)
            if check:
                check(page)
            violations = axe(page)
            if violations:
                found[f"{size} {scheme}"] = violations
            screenshot(page, f"{name}-{size}-{scheme}")
    return found


# -- 2. forms that respect input ----------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
def test_every_sampling_error_shows_beside_its_field_with_what_was_typed(open_page, problems, size):
    problems.allow(400)
    page = open_page(size)
    page.goto("/chat/")
    page.locator("#sampling summary").click()
    typed = {"temperature": "5", "top_k": "-3", "max_new_tokens": "99999", "seed": "abc"}
    for name, value in typed.items():
        page.fill(f"#{name}", value)
    page.fill("#content", "keep this draft")
    page.click("button.send")
    page.locator("#seed-error").wait_for()
    assert page.locator("#sampling").get_attribute("open") is not None
    for name, value in typed.items():
        assert page.locator(f"#{name}-error").is_visible(), name
        assert page.locator(f"#{name}").input_value() == value
        assert page.locator(f"#{name}").get_attribute("aria-invalid") == "true"
    assert page.locator("#content").input_value() == "keep this draft"
    assert "leaves room for a one-word message only" in page.locator("#max_new_tokens-hint").text_content()
    no_horizontal_scroll(page)
    screenshot(page, f"issue14-sampling-errors-{size}")


@pytest.mark.parametrize("size", SIZES)
def test_a_conversations_actions_keep_delete_beside_the_exports_and_give_present_and_share_rows_of_their_own(
        open_page, size):
    page = open_page(size)
    page.goto("/chat/")
    send(page, "Hello", max_new_tokens="3")
    page.wait_for_selector("li.message.assistant.complete")
    box = {name: page.get_by_role(role, name=name, exact=True).bounding_box() for role, name in
           [("link", "Export Markdown"), ("button", "Delete"), ("button", "Present"), ("button", "Share read-only")]}
    exports, delete, present, share = box.values()
    # Delete on the exports' row (centres level), then Present, then Share, each on a row below the last
    assert abs((delete["y"] + delete["height"] / 2) - (exports["y"] + exports["height"] / 2)) < 4, box
    assert exports["y"] + exports["height"] <= present["y"] and present["y"] + present["height"] <= share["y"], box
    assert present["x"] == share["x"] == exports["x"], box  # each starts its row at the left edge


def test_sampling_settings_are_remembered_and_reset(open_page):
    page = open_page()
    page.goto("/chat/")
    page.locator("#sampling summary").click()
    page.fill("#top_k", "7")
    page.fill("#max_new_tokens", "3")
    page.fill("#content", "Hello")
    page.click("button.send")
    page.wait_for_selector("li.message.assistant:not(.pending)")
    page.goto("/chat/")
    assert page.locator("#top_k").input_value() == "7" and page.locator("#max_new_tokens").input_value() == "3"
    page.locator("#sampling summary").click()
    page.fill("#content", "half written")
    page.get_by_role("button", name="Reset to defaults").click()
    page.wait_for_function("() => document.querySelector('#top_k').value === '50'")
    assert page.locator("#content").input_value() == "half written"
    page.reload()
    assert page.locator("#top_k").input_value() == "50"


def test_chat_status_is_a_live_region_and_enter_hint_needs_javascript(open_page):
    page = open_page()
    page.goto("/chat/")
    assert "Enter sends" in page.locator("#content").get_attribute("placeholder")
    set_reply_length(page, "200")  # 200 steps of 60 ms: still streaming while it is looked at
    page.fill("#content", "Hi")
    page.click("button.send")
    pending = page.locator("li.message.pending .reply-status")
    pending.wait_for()
    assert pending.get_attribute("role") == "status"
    page.locator("li.message.pending button.stop").click()
    page.wait_for_selector("li.message.assistant.stopped")
    plain = open_page(js=False)
    plain.goto("/chat/")
    assert "Enter" not in plain.locator("#content").get_attribute("placeholder")


# -- 3. the player -------------------------------------------------------------------------------
def test_the_player_steps_plays_and_works_from_the_keyboard(open_page):
    page = open_page()
    run_loops(page, "12")
    assert page.locator(VISIBLE_ROWS).count() == 12
    page.get_by_role("link", name="First").click()
    assert page.locator(VISIBLE_ROWS).count() == 1
    assert page.locator(".graph .node.current").count() == 1
    page.get_by_role("link", name="Next").focus()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert page.locator(VISIBLE_ROWS).count() == 3 and page.locator(".player-at").text_content() == "3"
    page.keyboard.press("End")
    assert page.locator(VISIBLE_ROWS).count() == 12
    page.keyboard.press("Home")
    page.select_option("#player-speed", "16")
    record(page, "rows", "(rows) => document.querySelectorAll(rows).length", VISIBLE_ROWS)
    page.get_by_role("button", name="Play").click()
    assert page.locator(".player-toggle").get_attribute("aria-pressed") == "true"
    page.wait_for_function("() => document.querySelector('.player-toggle').getAttribute('aria-pressed') === 'false'",
                           timeout=5_000)
    assert page.locator(VISIBLE_ROWS).count() == 12
    counts = [n for n, _ in recorded(page, "rows")]
    assert [n for n in counts if n > 1] == list(range(2, 13)), counts  # loop by loop from the first, not at once
    page.locator("#player-loop").focus()
    page.keyboard.press("Home")
    assert page.locator(".player-at").text_content() == "1"
    screenshot(page, "issue14-player")


def test_the_player_steps_without_javascript(open_page):
    page = open_page()
    run_loops(page, "5")
    trace_url = page.get_by_role("link", name="Private link").get_attribute("href")
    plain = open_page(js=False)
    plain.context.add_cookies(page.context.cookies())  # the same browser, with JavaScript off
    plain.goto(trace_url + "?loop=2")
    assert plain.locator(VISIBLE_ROWS).count() == 2
    plain.get_by_role("link", name="Next").click()
    plain.wait_for_url(re.compile(r"\?loop=3#player$"))  # the next page, loaded, before its rows are counted
    plain.wait_for_load_state()
    assert plain.locator(VISIBLE_ROWS).count() == 3
    plain.evaluate("document.querySelector('#player-loop').value = '5'")  # as dragging the slider would
    plain.get_by_role("button", name="Show").click()
    plain.wait_for_url(re.compile(r"loop=5"))
    plain.wait_for_load_state()
    assert plain.locator(VISIBLE_ROWS).count() == 5


# -- 4. share on purpose ---------------------------------------------------------------------------
def test_share_a_trace_then_revoke_it(open_page, problems):
    problems.allow(404)
    page = open_page()
    run_loops(page, "4")
    page.get_by_role("link", name="Private link").click()
    page.get_by_role("button", name="Share").click()
    link = page.locator("#share-url").input_value()
    assert "/loops/shared/" in link
    stranger = open_page("phone", "dark")
    stranger.goto(link)
    assert stranger.locator("h1").text_content() == "Shared Loop-lab trace"
    assert stranger.locator(".player").count() == 1
    no_horizontal_scroll(stranger)
    screenshot(stranger, "issue14-shared-phone-dark")
    page.get_by_role("button", name="Stop sharing").click()
    assert stranger.goto(link).status == 404


# -- 5. any screen -----------------------------------------------------------------------------------
def test_on_a_phone_results_scroll_into_view_and_nothing_widens_the_page(open_page):
    page = open_page("phone")
    page.goto("/loops/")
    no_horizontal_scroll(page)
    page.fill("#steps", "40")
    page.click("#run")
    page.wait_for_selector("#summary", timeout=30_000)
    top = page.evaluate("() => document.querySelector('#results').getBoundingClientRect().top")
    assert -5 <= top < 844 / 2, f"the results are at {top}px, not in view"  # they were at ~765px
    no_horizontal_scroll(page)
    screenshot(page, "issue14-loops-phone")


def test_a_long_run_leaves_no_blank_page_below_the_table(open_page):
    page = open_page()
    run_loops(page, "256")
    height = page.evaluate("() => document.documentElement.scrollHeight")
    assert height < 3000, f"the page is {height}px tall"


def test_touch_targets_are_at_least_24px(open_page):
    for size in SIZES:
        page = open_page(size)
        for path in ("/loops/", "/chat/"):
            page.goto(path)
            small = page.evaluate("""() => [...document.querySelectorAll(
                'button, select, input:not([type=hidden]), textarea, .topbar a, .player a, summary')]
              .filter(e => e.offsetParent !== null)
              .map(e => [e.id || e.className || e.textContent.trim(), e.getBoundingClientRect()])
              .filter(([, r]) => r.width < 24 || r.height < 24)
              .map(([name, r]) => name + ' ' + Math.round(r.width) + 'x' + Math.round(r.height))""")
            assert not small, f"{size} {path}: {small}"


def test_dark_mode_follows_the_system_and_the_toggle_is_remembered(open_page):
    page = open_page(scheme="dark")
    page.goto("/loops/")
    dark = page.evaluate("() => getComputedStyle(document.documentElement).backgroundColor")
    assert dark == "rgb(20, 21, 24)"
    page.get_by_role("button", name=re.compile("^Theme: auto")).click()   # auto -> dark
    page.get_by_role("button", name=re.compile("^Theme: dark")).click()   # dark -> light
    page.get_by_role("button", name=re.compile("^Theme: light")).wait_for()  # the form's reload has landed
    assert page.evaluate("() => document.documentElement.dataset.theme") == "light"
    assert page.url.endswith("/loops/")
    page.goto("/chat/")  # remembered in this browser's session
    assert page.evaluate("() => getComputedStyle(document.documentElement).backgroundColor") == "rgb(247, 247, 245)"


# -- 6. the model picker ----------------------------------------------------------------------------
def test_the_early_model_can_be_picked_and_its_trace_says_so(open_page):
    page = open_page()
    run_loops(page, "6", model="early")
    assert page.locator("#summary h2").text_content().strip().startswith("Not solved")
    assert "test:early" in page.locator("#summary").text_content()
    screenshot(page, "issue14-early-model")


# -- 7. every page, both themes, both sizes: no horizontal scroll, no serious axe violation -----------
@pytest.mark.parametrize("scheme, present", [("light", False), ("dark", False), ("light", True), ("dark", True)])
def test_every_page_passes_axe_and_fits_a_phone(open_page, problems, scheme, present):
    """present: in presentation mode (issue 31: large type, a projector's 1366 px only)."""
    problems.allow(404)
    setup = open_page()
    run_loops(setup, "20")
    trace_url = setup.get_by_role("link", name="Private link").get_attribute("href")
    setup.goto(trace_url)
    setup.get_by_role("button", name="Share").click()
    shared_url = setup.locator("#share-url").input_value()
    setup.goto("/chat/")
    setup.fill("#content", "Hello")
    setup.click("button.send")
    setup.wait_for_selector("li.message.assistant:not(.pending)")
    chat_url = setup.url
    reply = setup.locator("li.message.assistant").last.get_attribute("id").split("-")[1]
    setup.get_by_role("button", name="Share read-only").click()
    shared_chat = setup.locator("#share-url").input_value()
    pages = {"home": "/", "chat": "/chat/", "conversation": chat_url, "loops": "/loops/", "trace": trace_url,
             "trace-step": trace_url + "?loop=3", "shared": shared_url, "not-found": "/loops/traces/nope",
             "tokens": f"{chat_url}/m/{reply}/tokens?t=0", "prompt": f"{chat_url}/m/{reply}/prompt",
             "delete": f"{chat_url}/delete", "shared-chat": shared_chat}
    if present:
        large_type(setup)
    context_cookies = setup.context.cookies()
    found = {}
    for size in (["desktop"] if present else SIZES):
        page = open_page(size, scheme)
        page.context.add_cookies(context_cookies)  # the same browser: its trace and conversation
        for name, url in pages.items():
            page.goto(url)
            no_horizontal_scroll(page)
            if size == "desktop" or name in ("loops", "trace", "conversation"):
                problems_here = axe(page)
                if problems_here:
                    found[f"{size} {name}"] = problems_here
            if name in ("trace", "conversation", "home"):
                screenshot(page, f"issue14-{name}-{size}-{scheme}{'-present' if present else ''}")
    assert not found, found
