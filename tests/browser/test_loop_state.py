"""Issue 54 in Debian's Chromium: the latent-state model run past its head and its training from the page
("Beyond its training"), and what its state does drawn on the trace page, on a desktop and a phone."""

from __future__ import annotations

import pytest

from tests.browser.conftest import follow, screenshot
from tests.browser.test_usability import axe, no_horizontal_scroll
from tests.support.servers import ROOT, Gunicorn, model_env

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("issue54")
    env = {**model_env(work, chat_arch="tiny:0.02"), "GLASSBOX_LOOP_MODEL": str(ROOT / "models" / "loops"),
           "GLASSBOX_LOOP_EXTRA_MODELS": f"latent={ROOT / 'models' / 'loops-latent'}"}
    app = Gunicorn(work / "instance", env).start()
    yield app
    app.stop()


@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_a_forced_run_of_the_latent_model_draws_its_states_path(open_page, size):
    page = open_page(size)
    page.set_default_timeout(60_000)  # model runs behind these waits: a loaded machine takes longer
    page.goto("/loops/")  # the default table: one 26-cycle
    page.select_option("#model", "latent")
    page.fill("#steps", "10")
    page.locator("details.run-options summary").click()
    page.fill("#force_loops", "40")
    page.click("#run")
    page.locator("#state-view").wait_for()
    assert "forced to run 40 loops" in page.locator("#summary").text_content()
    assert page.locator("#trajectory circle.dot").count() == 40
    assert "carried from loop to loop" in page.locator("#trajectory figcaption").text_content()
    follow(page, page.get_by_role("link", name="Private link"))  # the saved trace draws it again
    assert page.locator("#trajectory circle.dot").count() == 40
    assert page.locator("#force_loops").input_value() == "40"  # the editor is back as it was run
    no_horizontal_scroll(page)
    assert not axe(page)
    screenshot(page, f"issue54-state-{size}")


@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_two_models_side_by_side_each_show_what_their_state_does(open_page, size):
    page = open_page(size)
    page.set_default_timeout(60_000)  # model runs behind these waits: a loaded machine takes longer
    page.goto("/loops/")
    page.fill("#steps", "6")
    page.click("#run")
    page.locator("#state-view").wait_for()
    page.select_option("#compare-model", "latent")
    follow(page, page.get_by_role("button", name="Run it there too"))
    for column in ("-1", "-2"):
        assert page.locator(f"#trajectory{column} circle.dot").count() == 6
        assert page.locator(f"#near-k{column} dd").count() >= 2
    no_horizontal_scroll(page)
    assert not axe(page)
    screenshot(page, f"issue54-compare-{size}")
