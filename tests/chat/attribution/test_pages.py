"""Who pushed this token through the app: the JSON contract (every number nanoGPT's math written out, the
parts adding up to the logit), `against`, the page without JavaScript (linked from the token panel and the
Inside page), who may see it (the owner, share links read-only), bad indices and bad `against`, a reply
still being written, and models it cannot run on (remote, another layout)."""

from __future__ import annotations

import re

import pytest

from tests.chat.attribution.test_compute import reference
from tests.chat.inside.test_pages import NotNanoGPT
from tests.chat.web import test_glass
from tests.chat.web.test_conversations import send, stream_url
from tests.chat.web.test_glass import reply
from tests.conftest import csrf_of, make_app, wait_for
from webapp.chat.web.token_views import token_text
from webapp.web.state import glassbox

chat_app = test_glass.chat_app  # the fixture: the same tiny model, made to never stop before max_new_tokens


def the_model(app):
    return glassbox(app).core.models["chat"].model


def contexts(app, mid):
    from webapp.chat.web.blueprint import service
    with app.app_context():
        details = service().details(mid)
    return details.prompt["ids"], [row[0] for row in details.odds]


def test_the_json_answers_the_contract_with_nanogpts_numbers_that_add_up_to_the_logit(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Hello there", max_new_tokens="4", temperature="0.9", top_k="0", seed="4")
    prompt, tokens = contexts(chat_app, mid)
    model = the_model(chat_app)
    config = model.config
    for i, token in enumerate(tokens):
        for against in (None, ord("e")):
            query = "" if against is None else f"?against={against}"
            answer = client.get(f"/chat/c/{cid}/m/{mid}/attribution/{i}.json{query}")
            assert answer.status_code == 200, answer.get_data(as_text=True)
            data = answer.get_json()
            assert set(data) == {"token", "against", "logit", "embed", "heads", "mlps", "biases"}
            assert data["token"]["index"] == i and data["token"]["id"] == token
            assert data["token"]["text"] == token_text(glassbox(chat_app).core.models["chat"].tokenizer, token)[0]
            assert data["against"] == (None if against is None else {"id": against, "text": "e"})
            assert len(data["heads"]) == config.n_layer and all(len(h) == config.n_head for h in data["heads"])
            assert len(data["mlps"]) == config.n_layer
            total = data["embed"] + sum(map(sum, data["heads"])) + sum(data["mlps"]) + data["biases"]
            assert total == pytest.approx(data["logit"], rel=1e-3)
            want = reference(model.state_dict(), prompt + tokens[:i], token, against, config)
            assert data["logit"] == pytest.approx(want["logit"], rel=1e-4, abs=1e-4)
            assert data["embed"] == pytest.approx(want["embed"], rel=1e-4, abs=1e-4)
            assert data["heads"] == [pytest.approx(row, rel=1e-4, abs=1e-4) for row in want["heads"].tolist()]
            assert data["mlps"] == pytest.approx(want["mlps"].tolist(), rel=1e-4, abs=1e-4)
            assert data["biases"] == pytest.approx(want["biases"], rel=1e-4, abs=1e-4)


def test_a_bad_against_is_400_naming_what_is_wanted(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Hello", max_new_tokens="2", temperature="0")
    url = f"/chat/c/{cid}/m/{mid}/attribution/0"
    vocabulary = glassbox(chat_app).core.models["chat"].tokenizer.n_vocab  # 261 bytes and specials; 264 rows
    for bad, says in (("e", "an integer"), ("1.5", "an integer"), ("-1", "from 0 to"),
                      (str(vocabulary), f"from 0 to {vocabulary - 1}"), ("9" * 30, "from 0 to")):
        answer = client.get(f"{url}.json?against={bad}")
        assert answer.status_code == 400 and says in answer.get_json()["error"], (bad, answer.get_json())
        page = client.get(f"{url}?against={bad}")
        assert page.status_code == 400 and says in page.get_data(as_text=True)
    assert client.get(f"{url}.json?against=").get_json()["against"] is None  # the form's "none"
    assert client.get(f"{url}.json?against={vocabulary - 1}").status_code == 200


def test_the_page_works_without_javascript_from_the_token_panel_and_the_inside_page(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Hello there", max_new_tokens="3", temperature="0")
    url = f"/chat/c/{cid}/m/{mid}/attribution/1"
    assert f'href="{url}"' in client.get(f"/chat/c/{cid}/m/{mid}/tokens?t=1").get_data(as_text=True)
    assert f'href="{url}"' in client.get(f"/chat/c/{cid}/m/{mid}/inside/1").get_data(as_text=True)
    page = client.get(url).get_data(as_text=True)  # no HX-Request: the request waits for the job
    config = the_model(chat_app).config
    grid = page[page.index('<table class="push-grid">'):]
    grid = grid[:grid.index("</table>")]
    assert grid.count('<th scope="row">L') == config.n_layer
    cells = re.findall(r'<td class="push (flat|up[1-5]|down[1-5])" title="([^"]+)">([+-]\d+\.\d\d)</td>', grid)
    assert len(cells) == config.n_layer * (config.n_head + 1)
    assert any(c[0] != "flat" for c in cells)  # the largest push takes the scale's end
    # heads and the MLPs each on their own scale (one scale ran to an MLP's push and left every head pale)
    heads = [c for c in cells if "head" in c[1]]
    top = max(heads, key=lambda c: abs(float(c[2])))
    assert top[0] in ("up5", "down5"), top  # the hardest-pushing head is at its scale's end
    data0 = client.get(f"{url}.json").get_json()
    assert f"heads {max(abs(v) for row in data0['heads'] for v in row):+.2f}" in page
    assert 'class="push-legend"' in page and "pushes up" in page and "pushes down" in page
    largest = page[page.index('<ol class="largest">'):]
    assert largest[:largest.index("</ol>")].count("<li>") == min(10, config.n_layer * (config.n_head + 1) + 2)
    data = client.get(f"{url}.json").get_json()
    assert f"{data['logit']:.3f}" in page
    form = page[page.index('<form class="against-form"'):]
    assert f'action="{url}"' in form and 'name="against"' in form and 'method="get"' in form
    versus = client.get(f"{url}?against=101").get_data(as_text=True)
    assert "minus that of" in versus and '<option value="101" selected>' in versus


def test_other_browsers_bad_indices_and_questions_get_404_and_share_links_read_only(chat_app):
    mine, theirs = chat_app.test_client(), chat_app.test_client()
    cid, mid, _ = reply(mine, "private", max_new_tokens="3", temperature="0")
    base = f"/chat/c/{cid}/m/{mid}/attribution"
    for path in (f"{base}/0", f"{base}/0.json"):
        assert mine.get(path).status_code == 200
        assert theirs.get(path).status_code == 404
    assert "No such conversation" in theirs.get(f"{base}/0.json").get_json()["error"]
    assert "No such token" in mine.get(f"{base}/3.json").get_json()["error"]
    assert mine.get(f"{base}/3").status_code == 404 and mine.get(f"{base}/-1.json").status_code == 404
    assert mine.get(f"/chat/c/{cid}/m/{mid - 1}/attribution/0.json").status_code == 404  # a question
    mine.post(f"/chat/c/{cid}/share", data={"csrf_token": csrf_of(mine, f"/chat/c/{cid}")})
    token = re.search(r"/chat/shared/([\w-]+)", mine.get(f"/chat/c/{cid}").get_data(as_text=True)).group(1)
    shared = f"/chat/shared/{token}/m/{mid}/attribution/0"
    assert f'href="{shared}"' in theirs.get(f"/chat/shared/{token}/m/{mid}/inside/0").get_data(as_text=True)
    page = theirs.get(shared).get_data(as_text=True)
    assert "Who pushed token 1" in page and 'method="post"' not in page.split("<main", 1)[1]
    assert theirs.get(f"{shared}.json?against=5").get_json() == mine.get(f"{base}/0.json?against=5").get_json()
    mine.post(f"/chat/c/{cid}/unshare", data={"csrf_token": csrf_of(mine, f"/chat/c/{cid}")})
    assert theirs.get(f"{shared}.json").status_code == 404


def test_a_reply_still_being_written_answers_409(tmp_path):
    from tests.support.chat_models import tiny_chat_model
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat", seconds_per_step=0.05)})
    try:
        client = app.test_client()
        sent = send(client, "Hello", max_new_tokens="200")
        mid = int(re.search(r"/m/(\d+)/stream", stream_url(sent.get_data(as_text=True))).group(1))
        cid = re.search(r'name="conversation_id" value="([0-9a-f]+)"', sent.get_data(as_text=True)).group(1)
        answer = client.get(f"/chat/c/{cid}/m/{mid}/attribution/0.json")
        assert answer.status_code == 409 and "still being written" in answer.get_json()["error"]
        assert client.get(f"/chat/c/{cid}/m/{mid}/attribution/0").status_code == 409
    finally:
        glassbox(app).core.shutdown()


def test_a_remote_backend_answers_409_with_the_reason(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Hello", max_new_tokens="2")
    glassbox(chat_app).core.models["chat"].remote = True
    answer = client.get(f"/chat/c/{cid}/m/{mid}/attribution/0.json")
    assert answer.status_code == 409 and "remote server" in answer.get_json()["error"]
    page = client.get(f"/chat/c/{cid}/m/{mid}/attribution/0")
    assert page.status_code == 409 and "remote server" in page.get_data(as_text=True)


def test_a_model_without_nanogpts_layout_answers_409(tmp_path):
    import torch

    from webapp.chat.model.loading import LoadedChatModel
    from webapp.chat.model.prompt import PromptBuilder
    from webapp.chat.model.tokenizer import ByteTokenizer
    torch.manual_seed(0)
    tok = ByteTokenizer()
    loaded = LoadedChatModel(model=NotNanoGPT().eval(), tokenizer=tok, block_size=512, supports_kv_cache=False,
                             checkpoint_id="owner", description="owner factory", prompt=PromptBuilder(tok, 512))
    app = make_app(tmp_path, {"chat": loaded})
    try:
        client = app.test_client()
        sent = send(client, "Hi", max_new_tokens="2")
        client.get(stream_url(sent.get_data(as_text=True))).get_data()
        mid = int(re.search(r"/m/(\d+)/stream", stream_url(sent.get_data(as_text=True))).group(1))
        cid = re.search(r'name="conversation_id" value="([0-9a-f]+)"', sent.get_data(as_text=True)).group(1)
        answer = client.get(f"/chat/c/{cid}/m/{mid}/attribution/0.json")
        assert answer.status_code == 409 and "nanoGPT's module layout" in answer.get_json()["error"]
    finally:
        glassbox(app).core.shutdown()


def test_a_split_is_kept_by_request_and_asked_again_runs_no_job(chat_app):
    client = chat_app.test_client()
    cid, mid, _ = reply(client, "Hello", max_new_tokens="2", temperature="0")
    finished = glassbox(chat_app).core.job_metrics.finished
    url = f"/chat/c/{cid}/m/{mid}/attribution/1.json"
    first = client.get(url).get_json()
    assert wait_for(lambda: finished.get(("attribution", "done")) == 1)
    assert client.get(url).get_json() == first and client.get(url.replace(".json", "")).status_code == 200
    assert client.get(f"{url}?against=7").status_code == 200  # another request: another job
    assert wait_for(lambda: finished.get(("attribution", "done")) == 2)
    assert finished.get(("attribution", "done")) == 2


def test_attribution_jobs_count_against_the_browsers_job_limit(tmp_path):
    from tests.support.chat_models import tiny_chat_model
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat", seconds_per_step=0.05)},
                   max_jobs_per_owner=1)
    try:
        client = app.test_client()
        cid, mid, _ = reply(client, "Hello", max_new_tokens="2")
        send(client, "And?", conversation_id=cid, max_new_tokens="200")  # running: the browser's one job
        answer = client.get(f"/chat/c/{cid}/m/{mid}/attribution/0.json")
        assert answer.status_code == 429 and answer.get_json()["error"]
    finally:
        glassbox(app).core.shutdown()
