"""Patch from another question through the app: the JSON contract against the hand-patched reference
(tests/chat/patching/test_compute.py), contexts of different lengths and bad alternatives (400), who may
ask (404, 409), the page without JavaScript, its stream of cells, and Stop."""

from __future__ import annotations

import re
import threading

import pytest
import torch

from tests.chat.patching.test_compute import reference_map
from tests.chat.patching.test_estimate import estimate_by_hand
from tests.chat.web import test_glass
from tests.chat.web.test_glass import reply
from tests.conftest import csrf_of, wait_for
from webapp.core.jobs import CANCELLED, DONE
from webapp.web.state import glassbox

chat_app = test_glass.chat_app  # the tiny byte-level model, made to never stop before max_new_tokens


def contexts(chat_app, mid, index, question, edited):
    """The clean and corrupted contexts of token `index`, built by hand from the saved prompt and odds."""
    from webapp.chat.web.blueprint import service
    with chat_app.app_context():
        details = service().details(mid)
    ids, reply_ids = details.prompt["ids"], [row[0] for row in details.odds[:index]]
    body, new = list(question.encode()), list(edited.encode())  # the byte tokenizer: a token per byte
    at = max(i for i in range(len(ids)) if ids[i:i + len(body)] == body)  # the last user message
    return ids + reply_ids, ids[:at] + new + ids[at + len(body):] + reply_ids, details.odds[index]


def post(client, cid, mid, index, body):
    return client.post(f"/chat/c/{cid}/m/{mid}/patching/{index}.json", json=body)


def test_the_json_answers_the_contract_and_equals_the_hand_patched_reference(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Where is France?", max_new_tokens="3", temperature="0")
    clean, corrupted, row = contexts(chat_app, mid, 2, "Where is France?", "Where is Jordan?")
    against = next(alt[0] for alt in row[5] if alt[0] != row[0])
    answer = post(client, cid, mid, 2, {"corrupted": "Where is Jordan?", "against": against})
    assert answer.status_code == 200, answer.get_json()
    data = answer.get_json()
    assert set(data) == {"estimate", "clean", "corrupted", "positions", "residual", "heads"}
    assert data["estimate"] is False
    model = glassbox(chat_app).core.models["chat"].model
    config = model.config
    assert len(data["positions"]) == len(clean) and data["positions"][:3] == ["<|bos|>", "<|user_start|>", "W"]
    assert len(data["residual"]) == config.n_layer + 1 and all(len(r) == len(clean) for r in data["residual"])
    assert len(data["heads"]) == config.n_layer and all(len(r) == config.n_head for r in data["heads"])
    want_clean, want_corrupted, residual, heads = reference_map(model, clean, corrupted, row[0], against)
    assert data["clean"] == pytest.approx(want_clean, rel=1e-4, abs=1e-4)
    assert data["corrupted"] == pytest.approx(want_corrupted, rel=1e-4, abs=1e-4)
    tolerance = 1e-3 * max(1.0, 1 / abs(want_clean - want_corrupted))
    for got, want in zip(data["residual"] + data["heads"], residual + heads):
        assert got == pytest.approx(want, abs=tolerance)
    again = post(client, cid, mid, 2, {"corrupted": "Where is Jordan?", "against": against})
    assert again.get_json() == data  # kept: no second job
    jobs = [j for j in glassbox(chat_app).core._jobs.values() if j.kind == "patching"]
    assert len(jobs) == 1
    # the clean run took the positions before the edit from the reply's kept KV cache, as Inside does
    first = next(p for p, (a, b) in enumerate(zip(clean, corrupted)) if a != b)
    assert jobs[0].result.reused_positions == first > 0


def test_contexts_of_different_lengths_get_400_with_both_counts_and_bad_alternatives_400(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Where is France?", max_new_tokens="2", temperature="0")
    clean, _, row = contexts(chat_app, mid, 1, "Where is France?", "Where is Jordan?")
    longer = post(client, cid, mid, 1, {"corrupted": "Where is Jordan now?", "against": 65})
    assert longer.status_code == 400
    error = longer.get_json()["error"]
    assert f"has {len(clean)}, the edited one {len(clean) + 4}" in error
    for body, words in (({"corrupted": "Where is Jordan?", "against": "x"}, "token id"),
                        ({"corrupted": "Where is Jordan?", "against": True}, "token id"),
                        ({"corrupted": "Where is Jordan?", "against": 10**6}, "No token 1000000"),
                        ({"corrupted": "Where is Jordan?", "against": row[0]}, "another token"),
                        ({"corrupted": "", "against": 65}, "non-empty"),
                        ({"corrupted": "Where is France?", "against": 65}, "same tokens"),
                        ({"corrupted": "Where is Jordan?", "against": 65, "estimate": "yes"}, "`estimate` as true")):
        answer = post(client, cid, mid, 1, body)
        assert answer.status_code == 400 and words in answer.get_json()["error"], (body, answer.get_json())
    assert client.post(f"/chat/c/{cid}/m/{mid}/patching/1.json", data="[1]",
                       content_type="application/json").status_code == 400
    from webapp.chat.patching.service import PatchingService
    glassbox(chat_app).service(PatchingService).max_cells = 20  # 3 x 10 positions + 2 x 2 heads: too many
    big = post(client, cid, mid, 1, {"corrupted": "Where is Jordan?", "against": 65})
    assert big.status_code == 400 and "would patch 34 cells" in big.get_json()["error"]
    guess = post(client, cid, mid, 1, {"corrupted": "Where is Jordan?", "against": 65, "estimate": True})
    assert guess.status_code == 200 and guess.get_json()["estimate"] is True  # one backward pass: no cap


def test_the_estimate_alone_answers_in_the_exact_maps_shape_and_equals_the_gradient_by_hand(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Where is France?", max_new_tokens="3", temperature="0")
    clean, corrupted, row = contexts(chat_app, mid, 2, "Where is France?", "Where is Jordan?")
    against = next(alt[0] for alt in row[5] if alt[0] != row[0])
    body = {"corrupted": "Where is Jordan?", "against": against}
    guess = post(client, cid, mid, 2, {**body, "estimate": True}).get_json()
    exact = post(client, cid, mid, 2, body).get_json()
    assert guess["estimate"] is True and exact["estimate"] is False
    assert guess["positions"] == exact["positions"] and guess["clean"] == exact["clean"]
    assert guess["corrupted"] == pytest.approx(exact["corrupted"], rel=1e-5, abs=1e-5)  # its own run's, rounded
    assert [len(r) for r in guess["residual"]] == [len(r) for r in exact["residual"]]
    assert [len(r) for r in guess["heads"]] == [len(r) for r in exact["heads"]]
    model = glassbox(chat_app).core.models["chat"].model
    residual, heads = estimate_by_hand(model, clean, corrupted, row[0], against)
    for got, want in zip(guess["residual"] + guess["heads"], residual + heads, strict=True):
        assert got == pytest.approx(want, rel=1e-3, abs=1e-4)


def test_other_browsers_get_404_and_remote_models_409(chat_app):
    mine, theirs = chat_app.test_client(), chat_app.test_client()
    cid, mid, _ = reply(mine, "Where is France?", max_new_tokens="2", temperature="0")
    body = {"corrupted": "Where is Jordan?", "against": 65}
    assert post(theirs, cid, mid, 0, body).status_code == 404
    assert theirs.get(f"/chat/c/{cid}/m/{mid}/patching/0").status_code == 404
    assert post(mine, cid, mid, 5, body).status_code == 404  # no such token
    assert post(mine, cid, mid - 1, 0, body).status_code == 404  # a question has no tokens
    glassbox(chat_app).core.models["chat"].remote = True
    answer = post(mine, cid, mid, 0, body)
    assert answer.status_code == 409 and "remote server" in answer.get_json()["error"]


def test_the_page_works_without_javascript_and_its_stream_fills_every_cell(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Where is France?", max_new_tokens="3", temperature="0")
    tokens = client.get(f"/chat/c/{cid}/m/{mid}/tokens?t=1").get_data(as_text=True)
    url = f"/chat/c/{cid}/m/{mid}/patching/1"
    assert f'href="{url}"' in tokens  # "Patch from another question", in the token panel
    form = client.get(url).get_data(as_text=True)
    assert "Where is France?</textarea>" in form and '<select id="patching-against" name="against">' in form
    against = re.search(r'<option value="(\d+)" selected>', form).group(1)
    page = client.get(url, query_string={"corrupted": "Where is Jordan?", "against": against})
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    config = glassbox(chat_app).core.models["chat"].model.config
    job = next(j for j in glassbox(chat_app).core._jobs.values() if j.kind == "patching")
    T, first = len(job.request.clean_ids), len(job.request.clean_ids) - len("Jordan?") - 2 - 1  # + user_end, reply
    # each column says its token, then its position, apart: "3" at 398 read as "3398" (issue 51)
    assert re.search(r'<th scope="col" class="pos"><code class="tokname">[^<]*</code><small class="at"> · '
                     r'<span class="visually-hidden">position </span>\d+</small></th>', html)
    # the residual map starts at the first edited position: before it every cell is 0
    assert f"the map starts at position {first}." in html
    assert len(re.findall(r'<th scope="col" class="pos">', html)) == T - first
    assert len(re.findall(r'<td id="pc-r-', html)) == (config.n_layer + 1) * (T - first)
    assert len(re.findall(r'<td id="pc-h-', html)) == config.n_layer * config.n_head
    stream = re.search(r'sse-connect="([^"]+)"', html)
    if stream:  # still running when the page was drawn: the stream sends the rest, then the whole maps
        events = client.get(stream.group(1).replace("&amp;", "&")).get_data(as_text=True)
        assert "event: done" in events
        assert f'id="pc-r-0-{first - 1}"' not in events  # cells the page leaves out are not streamed
    for _ in job.subscribe():
        pass
    assert job.state == DONE
    cells = [c for e in job.events if e.name == "cells" for c in e.data.indices]
    assert len(cells) == (config.n_layer + 1) * T + config.n_layer * config.n_head
    done = client.get(url, query_string={"corrupted": "Where is Jordan?", "against": against}).get_data(as_text=True)
    assert "pending" not in done and "sse-connect" not in done and "Done." in done
    assert re.search(r"Clean: logit difference <strong>-?\d", done)
    # each exact cell says its estimate and the error; the page how the two agree (issue 53)
    assert re.search(r'title="residual: -?\d\.\d{4} · estimated -?\d\.\d{4}, off by [+-]\d\.\d{4}"', done)
    assert re.search(r"Over the \d+ exact cells worked out: correlation with the estimate <strong>-?\d\.\d\d</strong>, "
                     r"mean error <strong>\d\.\d{3}</strong>", done)
    # the stream of a finished map sends what it sent live (the estimate first, every cell ≈, then the
    # exact cells), then the map whole, and closes
    finished = client.get(f"{url}/stream", query_string={"corrupted": "Where is Jordan?", "against": against})
    events = finished.get_data(as_text=True)
    assert events.count("event: done") == 1
    assert events.index("event: estimate") < events.index("event: cells")
    estimate = events[events.index("event: estimate"):events.index("event: cells")]
    assert estimate.count(" est\" ") == (config.n_layer + 1) * (T - first) + config.n_layer * config.n_head
    typed = client.get(url, query_string={"corrupted": "Where is Jordan?", "against_text": "ab"})
    assert typed.status_code == 400 and "exactly one token" in typed.get_data(as_text=True)


def test_stop_cancels_the_job_and_the_page_keeps_what_it_worked_out(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Where is France?", max_new_tokens="3", temperature="0")
    core = glassbox(chat_app).core
    core.executors["patching"].batch_tokens = 1  # a cell per forward: many batches to stop between
    url = f"/chat/c/{cid}/m/{mid}/patching/1"
    query = {"corrupted": "Where is Jordan?", "against": "65"}
    pressed = threading.Event()

    def hold(*_):  # once cells are out, the job waits (on the worker) until the test has pressed Stop
        job = next((j for j in core.running_jobs() if j.kind == "patching"), None)
        if job is not None and any(e.name == "cells" for e in job.events):
            pressed.wait(30)
    hook = core.models["chat"].model.transformer.h[0].attn.c_attn.register_forward_hook(hold)
    try:
        html = client.get(url, query_string=query).get_data(as_text=True)
        job = next(j for j in core._jobs.values() if j.kind == "patching")
        stop = re.search(r'<form method="post" action="([^"]+/stop/[^"]+)"', html)
        assert stop, html
        # Stop once cells are out (the hook then holds the job): pressed sooner, it stops before any cell
        assert wait_for(lambda: any(e.name == "cells" for e in job.events), timeout=60)
        answer = client.post(stop.group(1), data={"csrf_token": csrf_of(client, url), "corrupted": query["corrupted"]})
        pressed.set()
        assert answer.status_code == 303 and "stopped=1" in answer.headers["Location"]
        for _ in job.subscribe():
            pass
    finally:
        pressed.set()
        hook.remove()
    assert job.state == CANCELLED
    assert any(e.name == "cells" for e in job.events)
    page = client.get(answer.headers["Location"]).get_data(as_text=True)
    assert "Stopped: the cells marked ≈ keep their estimates" in page and "sse-connect" not in page
    assert re.search(r'<td id="pc-r-2-\d+" class="pcell d-?\d"', page)  # the cells it worked out, shown
    assert re.search(r'class="pcell d-?\d est" title="[^"]+">≈', page)  # the others, as estimated
    kinds = [j.kind for j in core._jobs.values()]
    assert kinds.count("patching") == 1  # the stopped page did not start it again


class Held:
    """Holds the patching job on the worker once its first cells are out, until released (a forward hook)."""

    def __init__(self, core) -> None:
        self.core, self.released = core, threading.Event()
        self.hook = core.models["chat"].model.transformer.h[0].attn.c_attn.register_forward_hook(self._hold)

    def _hold(self, *_) -> None:
        job = next((j for j in self.core.running_jobs() if j.kind == "patching"), None)
        if job is not None and any(e.name == "cells" for e in job.events):
            self.released.wait(30)

    def release(self) -> None:
        self.released.set()
        self.hook.remove()


def test_one_browsers_stop_never_stops_the_map_another_browser_asked_for(chat_app):
    """Identical requests from two browsers share one job (issue 52): B's Stop stops B's page only, and A's map
    is worked out whole; the last asker's Stop cancels it."""
    core = glassbox(chat_app).core
    core.executors["patching"].batch_tokens = 1
    a, b = chat_app.test_client(), chat_app.test_client()
    (cid_a, mid_a, _), (cid_b, mid_b, _) = (reply(c, "Where is France?", max_new_tokens="3", temperature="0")
                                            for c in (a, b))
    query = {"corrupted": "Where is Jordan?", "against": "65"}
    held = Held(core)
    try:
        a.get(f"/chat/c/{cid_a}/m/{mid_a}/patching/1", query_string=query)
        url_b = f"/chat/c/{cid_b}/m/{mid_b}/patching/1"
        html = b.get(url_b, query_string=query).get_data(as_text=True)
        job = next(j for j in core._jobs.values() if j.kind == "patching")
        assert [j.kind for j in core._jobs.values()].count("patching") == 1  # one job for both
        assert wait_for(lambda: any(e.name == "cells" for e in job.events), timeout=60)
        stop = re.search(r'<form method="post" action="([^"]+/stop/[^"]+)"', html).group(1)
        fragment = b.post(stop, data={"corrupted": query["corrupted"]},
                          headers={"HX-Request": "true", "X-CSRF-Token": csrf_of(b, url_b)})
        assert fragment.status_code == 200 and fragment.headers["HX-Retarget"] == "#patching-maps"
        assert "Stopped" in fragment.get_data(as_text=True) and "sse-connect" not in fragment.get_data(as_text=True)
        page_b = b.get(url_b, query_string={**query, "stopped": "1"}).get_data(as_text=True)  # no JavaScript
        assert "Stopped" in page_b and "sse-connect" not in page_b  # B's page stops there, and does not rejoin
        assert not job.finished_state
    finally:
        held.release()
    for _ in job.subscribe():
        pass
    assert job.state == DONE  # A's map, worked out whole
    page_a = a.get(f"/chat/c/{cid_a}/m/{mid_a}/patching/1", query_string=query).get_data(as_text=True)
    assert "Done." in page_a and 'class="pcell pending"' not in page_a


@pytest.fixture
def impatient_app(tmp_path):
    """The tiny model on a server whose experiment requests wait 1 s at most."""
    from tests.conftest import make_app
    from tests.support.chat_models import tiny_chat_model
    loaded = tiny_chat_model(tmp_path / "chat")
    first_special = min(loaded.tokenizer.special_ids.values())  # never stopping early, as test_glass's model
    loaded.model.lm_head.register_forward_hook(lambda m, a, logits: logits.index_fill_(
        -1, torch.arange(first_special, logits.size(-1)), float("-inf")))
    app = make_app(tmp_path, {"chat": loaded}, inside_wait_seconds=1)
    yield app
    glassbox(app).core.shutdown()


def test_a_json_request_that_stops_waiting_leaves_its_job_running_for_the_retry(impatient_app):
    """It answered 503 at the limit and cancelled the job: minutes of work thrown away (issue 52)."""
    client = impatient_app.test_client()
    core = glassbox(impatient_app).core
    core.executors["patching"].batch_tokens = 1
    cid, mid, _ = reply(client, "Where is France?", max_new_tokens="2", temperature="0")
    held = Held(core)
    try:
        waited = post(client, cid, mid, 1, {"corrupted": "Where is Jordan?", "against": 65})
        assert waited.status_code == 503 and "the work goes on" in waited.get_json()["error"]
        assert int(waited.headers["Retry-After"]) > 0
        job = next(j for j in core._jobs.values() if j.kind == "patching")
        assert not job.finished_state  # left running, not cancelled
    finally:
        held.release()
    for _ in job.subscribe():
        pass
    assert job.state == DONE
    again = post(client, cid, mid, 1, {"corrupted": "Where is Jordan?", "against": 65})
    assert again.status_code == 200 and again.get_json()["residual"], again.get_json()
    assert [j.kind for j in core._jobs.values()].count("patching") == 1  # the retry found its kept map


def test_an_edit_that_hardly_moves_the_metric_is_said_to_give_a_map_of_noise(chat_app):
    """A one-letter edit of a long message moved the bundled model's metric from 4.424 to 4.418: every cell divided
    by 0.006 (issue 53's benchmark). The page says so, and says nothing of the kind for an edit that moves it."""
    from flask import render_template

    from webapp.chat.patching.jobs import PatchingMetrics
    with chat_app.test_request_context():
        small = render_template("chat/_patching_values.html", values=PatchingMetrics(4.424, 4.418, 3))
        large = render_template("chat/_patching_values.html", values=PatchingMetrics(12.4, -14.6, 3))
        none = render_template("chat/_patching_values.html", values=PatchingMetrics(1.0, 1.0, 3))
    assert "hardly moves the metric</strong> (by 0.006)" in small and "the map is mostly noise" in small
    assert "hardly" not in large and "hardly" not in none and "nothing to restore" in none
