"""A feature's page in Debian's Chromium, on the bundled chat model and its bundled dictionary: on a phone (a
follower's, issue 51) it fits the screen, its title (the dictionary's hook name is one long word) wrapping; on a
projector in large type (tests/browser/test_projector.py) nothing is cut off or wider than the screen."""

from __future__ import annotations

import pytest

from tests.browser.conftest import large_type
from tests.browser.test_projector import PROJECTORS, misfits
from tests.browser.test_usability import no_horizontal_scroll
from tests.support.servers import Gunicorn

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The bundled models as `make run` serves them: the chat model with its dictionary beside it."""
    app = Gunicorn(tmp_path_factory.mktemp("features") / "instance", {}).start()
    yield app
    app.stop()


def test_a_features_page_fits_a_phone(open_page):
    page = open_page("phone")
    page.goto("/chat/features/glassbox/resid-2/1448")
    page.wait_for_selector("h1:has-text('Feature 1448')")
    assert "blocks.2.hook_resid_post" in page.locator("h1").text_content()
    no_horizontal_scroll(page)


@pytest.mark.parametrize("projector", PROJECTORS)
def test_a_features_page_fits_a_projector_in_large_type(open_page, projector):
    page = open_page()
    page.goto("/chat/features/glassbox/resid-2/1448")
    large_type(page)
    page.set_viewport_size(PROJECTORS[projector])
    page.goto("/chat/features/glassbox/resid-2/1448")
    page.wait_for_selector("h1:has-text('Feature 1448')")
    assert misfits(page, "h1", PROJECTORS[projector]) == []
