"""Headless Chromium (Debian's, never a downloaded one) driven by Playwright against real gunicorn.

Every page records console errors, uncaught exceptions and CSP violations; a test fails if any
appeared. Screenshots land in artifacts/ (gitignored)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.servers import CHROMIUM, ROOT, Gunicorn, model_env

ARTIFACTS = ROOT / "artifacts"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]
REPORT_CSP = """document.addEventListener("securitypolicyviolation", (e) =>
  console.error("CSP violation: " + e.violatedDirective + " " + e.blockedURI));"""


def _unavailable(reason: str) -> None:
    if os.environ.get("GLASSBOX_REQUIRE_SYSTEM_TESTS"):  # set by `make test`: never skip there
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[test]')")
    if not Path(CHROMIUM).exists():
        _unavailable(f"{CHROMIUM} is missing (make system-packages)")
    if not (ROOT / "static" / "vendor" / "htmx.min.js").exists():
        _unavailable("htmx is not installed in static/vendor (make install)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Replies at 60 ms a token (30 tokens unless asked), loops at 150 ms each: slow enough to watch."""
    work = tmp_path_factory.mktemp("browser")
    env = {**model_env(work, chat_arch="tiny:0.06", loop_delay=0.15), "GLASSBOX_MAX_NEW_TOKENS": "30"}
    app = Gunicorn(work / "instance", env).start()
    yield app
    app.stop()


class Problems(list):
    """Console errors, page errors and CSP violations. A 4xx a test provokes on purpose is logged by
    Chromium too ("Failed to load resource"): `allow(400)` says it is expected."""

    def __init__(self) -> None:
        super().__init__()
        self.allowed: set[int] = set()

    def allow(self, status: int) -> None:
        self.allowed.add(status)

    def watch(self, page) -> None:
        page.on("console", lambda m: self._console(m))
        page.on("pageerror", lambda e: self.append(f"page error: {e}"))

    def _console(self, message) -> None:
        if message.type != "error":
            return
        if any(f"status of {status} " in message.text for status in self.allowed):
            return
        self.append(f"console error: {message.text}")


@pytest.fixture
def problems():
    found = Problems()
    yield found
    assert not found, "\n".join(found)


@pytest.fixture
def open_context(browser, server, problems):
    """Opens browser contexts (separate cookie jars: separate owners) whose pages are watched."""
    contexts = []

    def open_():
        context = browser.new_context(base_url=server.url, viewport={"width": 1280, "height": 900})
        context.add_init_script(REPORT_CSP)
        context.set_default_timeout(15_000)
        context.on("page", problems.watch)
        contexts.append(context)
        return context

    yield open_
    for context in contexts:
        context.close()


SIZES = {"desktop": {"width": 1366, "height": 768}, "phone": {"width": 390, "height": 844}}


@pytest.fixture
def open_page(browser, server, problems):
    """Opens watched pages at a size of SIZES, in a colour scheme, with or without JavaScript (each its own
    browser context: its own owner)."""
    contexts = []

    def open_(size="desktop", scheme="light", js=True, cookies=None):
        context = browser.new_context(base_url=server.url, viewport=SIZES[size], color_scheme=scheme,
                                      java_script_enabled=js)
        context.add_init_script(REPORT_CSP)
        context.set_default_timeout(20_000)
        context.on("page", problems.watch)
        if cookies:  # another page of the same browser (its owner's cookie)
            context.add_cookies(cookies)
        contexts.append(context)
        return context.new_page()

    yield open_
    for context in contexts:
        context.close()


@pytest.fixture
def page(open_context):
    return open_context().new_page()


def screenshot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def follow(page, target) -> None:
    """Click a link or a form's button that leads to another page, and wait for that page's load: its
    stylesheets applied and its scripts run. What is in the DOM before then is unstyled, and a focus or
    hover on it shows no panel (both seen on a loaded machine)."""
    with page.expect_navigation(wait_until="load"):
        target.click()


def large_type(page, on: bool = True) -> None:
    """Press Large type and wait for the page it posts back to to load (follow): the new <html
    data-present> can be in the DOM before its stylesheets are, so waiting for the attribute alone
    measures unstyled text."""
    follow(page, page.get_by_role("button", name="Large type"))
    state = page.evaluate("() => document.documentElement.dataset.present || 'off'")
    assert state == ("on" if on else "off"), state


RECORDER = """([name, argument]) => {
    const value = VALUE, states = (window.recorded ??= {})[name] = [];
    new MutationObserver(() => {
      const now = value(argument);
      if (now !== null && now !== undefined && now !== "" && (!states.length || states.at(-1)[0] !== now))
        states.push([now, performance.now()]);
    }).observe(document.body, {subtree: true, childList: true, attributes: true, characterData: true});
  }"""


def record(page, name: str, expression: str, argument=None) -> None:
    """Records in the page every value `expression` (a JavaScript arrow function of `argument`) takes as the
    page changes, with when: a MutationObserver runs it after every change, so no state is missed however
    loaded the machine (a test that polled every 30 ms missed some, and saw some it should not have). Values
    that are null, undefined or "" are skipped. Read them with recorded()."""
    page.evaluate(RECORDER.replace("VALUE", expression), [name, argument])


def recorded(page, name: str) -> list[tuple]:
    """(value, seconds since the first value recorded) for every value record() saw, in order"""
    states = page.evaluate("(name) => window.recorded[name]", name)
    return [(value, (t - states[0][1]) / 1000) for value, t in states]
