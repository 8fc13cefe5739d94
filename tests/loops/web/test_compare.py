"""Issue 32, "Compare with …": a finished trace's request on another model, both traces side by side, the
first loop where they differ marked, both players stepping to the same loop (links, without JavaScript)."""

import re

import pytest

from tests.conftest import csrf_of, make_app
from tests.loops.early_model import load as early_bundle
from tests.support.loop_models import bundle
from webapp.loops.task import SYMBOLS
from webapp.loops.web.compare import first_difference
from webapp.web.state import glassbox

CYCLE = [[s, SYMBOLS[(i + 1) % 26]] for i, s in enumerate(SYMBOLS)]


@pytest.fixture
def two_models(tmp_path, monkeypatch):
    """The scripted model, and beside it the scripted early one (a wrong letter from loop 4 on)."""
    monkeypatch.setenv("GLASSBOX_LOOP_EXTRA_MODELS", "early=tests.loops.early_model:load")
    app = make_app(tmp_path, {"loops": bundle()})
    yield app
    glassbox(app).core.shutdown()


def test_first_difference():
    rows = [{"prediction": p} for p in "BCDE"]
    assert first_difference(rows, rows) is None
    assert first_difference(rows, rows[:2] + [{"prediction": "X"}, {"prediction": "E"}]) == 3
    assert first_difference(rows, rows[:3]) == 4  # one stopped, the other ran on
    assert early_bundle  # the early model the fixture offers


def run(client, csrf, model="main", steps="6"):
    data = {"csrf_token": csrf, "start": "A", "steps": steps, "src": [s for s, _ in CYCLE],
            "dst": [d for _, d in CYCLE], "model": model}
    response = client.post("/loops/run", data=data)
    assert response.status_code == 303
    return response.headers["Location"].rsplit("/", 1)[-1]


def test_compare_with_another_model_shows_both_and_marks_where_they_differ(two_models):
    client = two_models.test_client()
    csrf = csrf_of(client, "/loops/")
    trace_id = run(client, csrf)
    page = client.get(f"/loops/traces/{trace_id}").get_data(as_text=True)
    assert f'action="/loops/traces/{trace_id}/compare"' in page and 'value="early"' in page
    assert 'value="main"' not in re.search(r'<select id="compare-model".*?</select>', page, re.S).group(0)
    response = client.post(f"/loops/traces/{trace_id}/compare", data={"csrf_token": csrf, "model": "early"})
    assert response.status_code == 303
    compare_url = response.headers["Location"]
    page = client.get(compare_url).get_data(as_text=True)
    assert page.count('class="results compare-column"') == 2
    assert "They first differ at" in page and "loop 4" in page
    assert page.count("data-first-difference") == 2  # the row marked in both tables
    assert page.count('data-link="compare"') == 2 and 'id="player-1"' in page and 'id="player-2"' in page
    # both players step together: ?loop=N holds both back to loop N
    stepped = client.get(compare_url + "?loop=2").get_data(as_text=True)
    assert stepped.count('data-current="2"') == 2
    assert stepped.count('class="ahead"') == 2 * 4  # loops 3–6 held back in each table
    # the same model again, or one not offered, is refused
    assert client.post(f"/loops/traces/{trace_id}/compare", data={"csrf_token": csrf, "model": "main"}
                       ).status_code == 400
    assert client.post(f"/loops/traces/{trace_id}/compare", data={"csrf_token": csrf, "model": "x"}
                       ).status_code == 400


def test_compare_needs_two_traces_of_one_request_of_this_browser(two_models):
    client = two_models.test_client()
    csrf = csrf_of(client, "/loops/")
    first, other = run(client, csrf), run(client, csrf, "early", steps="5")
    assert client.get(f"/loops/compare/{first}/{other}").status_code == 404
    stranger = two_models.test_client()
    assert stranger.get(f"/loops/compare/{first}/{first}").status_code == 404
