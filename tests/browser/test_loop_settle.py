"""Issue 32 item 4 in Debian's Chromium, with the bundled Loop-lab model: "does the state settle" drawn
under the stop chart on the trace page, in the same column, on a desktop and a phone."""

from __future__ import annotations

import pytest

from tests.browser.conftest import screenshot
from tests.browser.test_usability import no_horizontal_scroll, run_loops
from tests.support.servers import ROOT, Gunicorn, model_env

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("issue32")
    env = {**model_env(work, chat_arch="tiny:0.02"), "GLASSBOX_LOOP_MODEL": str(ROOT / "models" / "loops"),
           "GLASSBOX_LOOP_EXTRA_MODELS": ""}
    app = Gunicorn(work / "instance", env).start()
    yield app
    app.stop()


def test_the_state_change_is_drawn_under_the_stop_chart(open_page):
    page = open_page()
    run_loops(page, "12")
    page.goto(page.get_by_role("link", name="Private link").get_attribute("href"))
    stop = page.locator("svg.chart").first.bounding_box()
    settle = page.locator("#settle svg.settle").bounding_box()
    assert stop is not None and settle is not None
    assert settle["y"] >= stop["y"] + stop["height"]           # under it
    assert abs(settle["x"] - stop["x"]) < 20                   # in the same column, on the same loop axis
    assert page.locator("#settle .settle-dot").count() == 11   # loops 2..12
    assert "Does the state settle?" in page.locator("#settle figcaption").text_content()
    no_horizontal_scroll(page)
    screenshot(page, "issue32-settle")
