"""The editor's form (webapp/loops/web/forms.py) is bounded by what it can hold (issue 25, item 2): a body
far over a real form's size is refused (413) before it is parsed, and no more rules than the table's 26
are ever kept or rendered, so a script's 10,000 src/dst pairs cost no more than a real form."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from tests.conftest import csrf_of
from webapp.loops.task import SYMBOLS
from webapp.loops.web.forms import MAX_FORM_BYTES, MAX_RULES, EditorState

CYCLE = [[s, SYMBOLS[(i + 1) % 26]] for i, s in enumerate(SYMBOLS)]
FORM = "application/x-www-form-urlencoded"


def body(csrf: str, pairs: list[list[str]], **extra: str) -> str:
    fields = [("csrf_token", csrf), ("start", "A"), ("steps", "4"), *extra.items()]
    return urlencode(fields + [(k, v) for s, d in pairs for k, v in (("src", s), ("dst", d))])


@pytest.mark.parametrize("path", ["/loops/editor", "/loops/run"])
def test_a_flood_of_rules_is_refused_before_it_is_parsed(loop_app, path):
    client = loop_app.test_client()
    csrf = csrf_of(client, "/loops/")
    flood = body(csrf, [["A", "B"]] * 10_000, action="shuffle")  # ~200 KB, under GLASSBOX_MAX_BODY_BYTES
    response = client.post(path, data=flood, content_type=FORM)
    assert response.status_code == 413
    assert f"the limit is {MAX_FORM_BYTES // 1024} KiB" in response.get_data(as_text=True)
    assert len(response.get_data()) < 20_000  # a short page, not 10,000 rendered rows
    htmx = client.post(path, data=flood, content_type=FORM, headers={"HX-Request": "true"})
    assert htmx.status_code == 413 and htmx.headers["HX-Retarget"] == "#flash"


def test_a_real_form_is_far_under_the_bound(loop_app):
    client = loop_app.test_client()
    real = body(csrf_of(client, "/loops/"), CYCLE, model="main", action="preset:function")
    assert len(real) * 4 < MAX_FORM_BYTES
    assert client.post("/loops/editor", data=real, content_type=FORM).status_code == 200


def test_rules_past_the_tables_26_are_dropped_and_a_run_with_them_is_refused(loop_app):
    client = loop_app.test_client()
    csrf = csrf_of(client, "/loops/")
    extra = CYCLE + [["A", "C"]] * 500  # under the byte bound: parsed, but never more than 26 kept
    edited = client.post("/loops/editor", data=body(csrf, extra, action="up:1"), content_type=FORM)
    page = edited.get_data(as_text=True)
    assert edited.status_code == 200 and page.count('name="src"') == MAX_RULES == 26
    run = client.post("/loops/run", data=body(csrf, extra), content_type=FORM)
    assert run.status_code == 400 and "Supply all 26 A–Z rules" in run.get_data(as_text=True)
    assert client.post("/loops/run", data=body(csrf, CYCLE), content_type=FORM).status_code == 303


def test_the_state_keeps_at_most_the_tables_rules():
    from werkzeug.datastructures import MultiDict
    form = MultiDict([("src", "A"), ("dst", "B")] * 1000 + [("start", "A"), ("steps", "3")])
    state = EditorState.from_form(form)
    assert len(state.pairs) == MAX_RULES and state.extra_rules == 1000 - MAX_RULES
