"""Issue 31 (items 3-7) in Chromium: the Loop lab's table and run survive reload, the theme button and a
visit elsewhere; presentation mode; a phone's width; the views that say what they show."""

from __future__ import annotations

import re

import pytest

from tests.support.servers import Gunicorn, model_env

pytestmark = pytest.mark.browser

DST0 = "() => document.querySelector('#dst-0').value"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("issue31")
    env = {**model_env(work, chat_arch="tiny:0.02", loop_delay=0.02), "GLASSBOX_MAX_NEW_TOKENS": "8"}
    app = Gunicorn(work / "instance", env).start()
    yield app
    app.stop()


def wait_for_table(page, first: str, steps: str) -> None:
    page.wait_for_function(f"() => document.querySelector('#dst-0').value === '{first}'"
                           f" && document.querySelector('#steps').value === '{steps}'")


# -- 4. state that survives ---------------------------------------------------------------------------
def test_the_edited_table_and_the_run_survive_reload_theme_and_a_visit_elsewhere(open_page):
    page = open_page()
    page.goto("/loops/")
    page.get_by_role("button", name="Identity").click()
    page.wait_for_function("() => document.querySelector('#dst-1').value === 'B'")
    page.get_by_role("button", name="Move rule B up").click()  # the order is part of the prompt
    page.wait_for_function("() => document.querySelector('input[name=src]').value === 'B'")
    page.select_option("#dst-1", "C")  # now rule A (second) points to C
    page.fill("#steps", "5")
    page.reload()
    wait_for_table(page, "B", "5")
    assert page.evaluate("() => document.querySelector('#dst-1').value") == "C"
    assert page.locator("input[name=src]").first.input_value() == "B"
    page.get_by_role("button", name=re.compile("^Theme")).click()
    page.wait_for_load_state()
    wait_for_table(page, "B", "5")
    assert page.evaluate("() => document.querySelector('#dst-1').value") == "C"
    page.get_by_role("link", name="Chat").click()
    page.wait_for_selector("#content")
    page.get_by_role("link", name="Loop lab").click()
    wait_for_table(page, "B", "5")

    page.click("#run")
    page.wait_for_selector("#summary", timeout=30_000)
    page.wait_for_url(re.compile(r"/loops/traces/[^/?]+$"))
    trace = page.url
    assert page.get_by_role("link", name="Private link").get_attribute("href") in trace
    page.reload()
    assert page.url == trace and page.locator("#summary").count() == 1
    wait_for_table(page, "B", "5")
    assert page.evaluate("() => document.querySelector('#dst-1').value") == "C"
    page.get_by_role("link", name="Chat").click()
    page.wait_for_selector("#content")
    page.get_by_role("link", name="Loop lab").click()
    page.wait_for_selector("#summary")
    assert page.url == trace
    for _ in range(3):  # Back past Chat and the trace's page: the lab, with the table it ran
        page.go_back()
    page.wait_for_url(re.compile(r"/loops/$"))
    wait_for_table(page, "B", "5")


def test_without_javascript_a_run_lands_on_its_trace_with_its_table(open_page):
    page = open_page(js=False)
    page.goto("/loops/")
    page.get_by_role("button", name="Identity").click()
    page.select_option("#dst-0", "D")
    page.fill("#steps", "4")
    page.click("#run")
    assert re.search(r"/loops/traces/[^/?]+$", page.url)
    page.reload()
    assert page.evaluate(DST0) == "D" and page.locator("#steps").input_value() == "4"
