"""Two chat models in a real browser (GLASSBOX_CHAT_MODELS on real gunicorn): one message answered by both,
the two replies streaming side by side, each labelled with its model; without JavaScript too."""

from __future__ import annotations

import pytest

from tests.browser.conftest import screenshot
from tests.support.chat_models import tiny_checkpoint
from tests.support.servers import Gunicorn, model_env

pytestmark = pytest.mark.browser
PAIR = "li.pair li.message.assistant"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Two tiny models of other weights, 60 ms a token each: slow enough to see both stream."""
    work = tmp_path_factory.mktemp("two-models")
    for name, seed in (("first", 1), ("second", 2)):
        tiny_checkpoint(work / name, seed=seed)
    registry = work / "models.toml"
    registry.write_text("".join(f"[models.{name}]\ncheckpoint = '{name}/model.safetensors'\n"
                                "factory = 'tests.support.served_models:build_chat_model'\narch = 'tiny:0.06'\n"
                                for name in ("first", "second")))
    env = {**model_env(work), "GLASSBOX_CHAT_MODELS": str(registry), "GLASSBOX_MAX_NEW_TOKENS": "24"}
    app = Gunicorn(work / "instance", env).start()
    yield app
    app.stop()


def ask_both(page) -> None:
    page.goto("/chat/")
    page.select_option("#model", "first")
    page.select_option("#also_model", "second")
    page.fill("#content", "Hello, both of you")
    page.click("button.send")


def test_two_models_answer_one_message_side_by_side_as_they_stream(open_page):
    page = open_page()
    ask_both(page)
    page.wait_for_selector(f"{PAIR}.pending >> nth=1")  # both are under way at once, side by side
    boxes = [page.locator(PAIR).nth(i).bounding_box() for i in range(2)]
    assert boxes[0]["x"] + boxes[0]["width"] <= boxes[1]["x"]  # beside, not below
    assert abs(boxes[0]["y"] - boxes[1]["y"]) < 2
    # tokens arrive in both before either ends
    page.wait_for_function(f"() => [...document.querySelectorAll('{PAIR}.pending .text')]"
                           ".filter(t => t.textContent.length).length === 2")
    page.wait_for_function(f"() => document.querySelectorAll('{PAIR}.complete').length === 2", timeout=30_000)
    labels = page.locator(f"{PAIR} .model-name").all_inner_texts()
    assert labels == ["first", "second"]
    assert "beside=" in page.url  # a reload keeps the pair
    screenshot(page, "two-models-side-by-side")
    page.reload()
    assert page.locator(f"{PAIR}.complete").count() == 2
    compare = page.locator(f"{PAIR} >> nth=1").get_by_role("link", name="Compare with 1")
    compare.click()
    page.wait_for_selector("text=first")
    assert "compare" in page.url


def test_without_javascript_the_form_waits_for_both_then_shows_them_side_by_side(open_page):
    page = open_page(js=False)
    ask_both(page)
    page.wait_for_selector(f"{PAIR}.complete >> nth=1", timeout=40_000)
    assert page.locator(f"{PAIR} .model-name").all_inner_texts() == ["first", "second"]
    assert page.locator("li.message.assistant.pending").count() == 0
