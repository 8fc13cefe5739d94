"""The Loop lab in a real browser: edit a rule, run, rows arrive one by one, summary and pictures,
and a bad step count is answered next to its field."""

from __future__ import annotations

import pytest

from tests.browser.conftest import record, recorded, screenshot

pytestmark = pytest.mark.browser

ROWS = "#results tbody tr"


def test_edit_a_rule_run_and_watch_the_rows_then_the_summary_and_pictures(page):
    page.goto("/loops/")
    page.get_by_role("button", name="Identity").click()  # every letter points to itself
    page.wait_for_function("() => document.querySelector('#dst-0').value === 'A'")
    page.select_option("#dst-0", "C")  # edit: now A -> C, and C -> C
    page.fill("#steps", "6")
    record(page, "rows", "(rows) => document.querySelectorAll(rows).length", ROWS)
    page.click("#run")
    page.wait_for_selector("#summary")
    counts = recorded(page, "rows")
    part_way = [t for n, t in counts if 0 < n < 6]
    assert len(part_way) >= 3, f"rows did not arrive one by one: {counts}"
    # loops 1 to 5 take 0.6 s at least (0.15 s each): shown as they come, not held back and shown at once
    assert part_way[-1] - part_way[0] >= 0.2, counts
    assert page.locator("svg.graph").count() == 1 and page.locator("svg.chart").count() == 1
    assert page.locator(ROWS).count() == 6
    expected = page.locator(f"{ROWS} td:nth-child(3)").all_text_contents()
    assert expected == ["C"] * 6  # the edited rule is what the model was asked about
    assert page.locator("#summary h2").text_content().strip().startswith("Solved")
    assert page.get_by_role("link", name="Private link").count() == 1
    screenshot(page, "loops")


@pytest.mark.parametrize("steps", ["0", "abc", "257"])
def test_an_invalid_step_count_is_answered_inline_next_to_the_field(page, problems, steps):
    problems.allow(400)  # the answer to bad input
    page.goto("/loops/")
    page.fill("#steps", steps)
    page.click("#run")
    error = page.locator("#steps-error")
    error.wait_for()
    assert error.text_content() == "Steps must be an integer from 1 to 256"
    assert page.locator("#steps").get_attribute("aria-invalid") == "true"
    assert page.locator("#steps").get_attribute("aria-describedby") == "steps-error"
    # next to its field: in the same field group, right under the input
    assert page.evaluate("() => document.querySelector('#steps-error').parentElement"
                         " === document.querySelector('#steps').parentElement")
    assert page.locator("#steps").input_value() == steps  # what was typed is given back
    assert page.locator(ROWS).count() == 0  # nothing ran
    if steps == "0":
        screenshot(page, "loops-invalid-steps")
