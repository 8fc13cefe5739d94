"""When the server cannot take more work, the page says so where the reader is looking."""

from __future__ import annotations

import pytest

from tests.support.servers import Gunicorn, model_env, wait_until

pytestmark = pytest.mark.browser


@pytest.fixture
def tiny_queue(tmp_path):
    """Room for one waiting job only; loops take 150 ms each."""
    env = {**model_env(tmp_path, loop_delay=0.15), "GLASSBOX_MAX_QUEUE": "1"}
    app = Gunicorn(tmp_path / "instance", env).start()
    yield app
    app.stop()


def test_a_full_queue_is_reported_in_the_page(browser, tiny_queue, problems):
    problems.allow(503)  # the answer we are provoking
    pages = []
    for _ in range(3):  # three colleagues, one after the other
        context = browser.new_context(base_url=tiny_queue.url)
        context.on("page", problems.watch)
        page = context.new_page()
        page.goto("/loops/")
        page.fill("#steps", "60")
        pages.append(page)
    pages[0].click("#run")
    pages[0].wait_for_selector("#results .run-status")
    assert wait_until(lambda: tiny_queue.metrics()["glassbox_running_jobs"] == 1, 10)  # out of the queue
    pages[1].click("#run")
    pages[1].wait_for_selector("#results .run-status")
    pages[2].click("#run")
    flash = pages[2].locator("#flash")
    flash.get_by_text("The server is busy; try again in a moment").wait_for()
    for page in pages:
        page.context.close()


def test_a_server_that_does_not_answer_is_reported_in_the_page(browser, tiny_queue):
    context = browser.new_context(base_url=tiny_queue.url)  # unwatched: the refused connection is logged
    page = context.new_page()
    page.goto("/loops/")
    tiny_queue.stop()  # a restart in progress: nothing listens
    page.click("#run")
    page.locator("#flash").get_by_text("The server did not answer").wait_for()
    context.close()
