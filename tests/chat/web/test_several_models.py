"""Several chat models in one server (GLASSBOX_CHAT_MODELS): /v1 lists and picks them, a conversation keeps
its model, one message asks two models at once, and every reply answers for the model that wrote it: when
that model is not run here any more, its Inside, tokens and branching answer 409 naming it."""

from __future__ import annotations

import re

import pytest

from tests.chat.attribution.test_compute import reference
from tests.chat.web.test_conversations import conversation_id_of, send
from tests.conftest import csrf_of, make_app, sse_events, wait_for
from tests.support.chat_models import tiny_checkpoint
from webapp.chat import boot
from webapp.config import Settings
from webapp.web.state import glassbox

HI = [{"role": "user", "content": "Hello there"}]


@pytest.fixture
def registry(tmp_path):
    """Two tiny models of other weights (seeds 1 and 2), as a registry file names them."""
    tiny_checkpoint(tmp_path / "first", seed=1)
    tiny_checkpoint(tmp_path / "second", seed=2)
    path = tmp_path / "models.toml"
    path.write_text("[models.first]\ncheckpoint = 'first/model.safetensors'\n"
                    "[models.second]\ncheckpoint = 'second/model.safetensors'\n")
    return path


def app_on(tmp_path, registry_text: str | None, registry_path=None, **settings):
    if registry_text is not None:
        registry_path.write_text(registry_text)
    models = boot.load_models(Settings(chat_models=str(registry_path)))
    return make_app(tmp_path, {"chat": models}, **settings)


def greedy(client, model=None) -> str:
    body = {"messages": HI, "temperature": 0, "max_tokens": 12, **({"model": model} if model else {})}
    answer = client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.get_data(as_text=True)
    return answer.json["choices"][0]["message"]["content"]


def finish(client, html: str) -> list[tuple[str, str]]:
    """Stream every reply the fragment shows to its end."""
    return [sse_events(client.get(url).get_data(as_text=True)) for url in re.findall(r'sse-connect="([^"]+)"', html)]


def messages(app, conversation_id):
    from webapp.chat.web.blueprint import service
    with app.app_context():
        return service().all_messages(conversation_id)


def test_v1_lists_both_models_and_each_answers_as_it_does_served_alone(tmp_path, registry):
    app = app_on(tmp_path / "both", None, registry)
    try:
        client = app.test_client()
        assert [m["id"] for m in client.get("/v1/models").json["data"]] == ["first", "second"]
        assert client.get("/v1/models/second").json["id"] == "second"
        both = {name: greedy(client, name) for name in ("first", "second")}
        assert greedy(client) == both["first"]  # no model named: the first, the default
        unknown = client.post("/v1/chat/completions", json={"messages": HI, "model": "glassbox"})
        assert unknown.status_code == 404
        assert "'first', 'second'" in unknown.json["error"]["message"]
    finally:
        glassbox(app).core.shutdown()
    assert both["first"] != both["second"]  # other weights: the test could tell them apart
    for name in ("first", "second"):
        checkpoint = str(tmp_path / name / "model.safetensors")
        alone = make_app(tmp_path / f"alone-{name}", {"chat": boot.load_model(Settings(chat_checkpoint=checkpoint))})
        try:
            assert greedy(alone.test_client()) == both[name]
        finally:
            glassbox(alone).core.shutdown()


def test_a_conversation_keeps_its_model_and_a_restart_without_it_answers_409_naming_it(tmp_path, registry):
    app = app_on(tmp_path, None, registry)
    try:
        client = app.test_client()
        page = client.get("/chat/").get_data(as_text=True)
        assert '<select id="model" name="model"' in page and "Model: <strong>first</strong>" in page
        sent = send(client, "Hello", model="second", max_new_tokens="6", temperature="0")
        assert sent.status_code == 200
        finish(client, sent.get_data(as_text=True))
        cid = conversation_id_of(sent)
        reply = [m for m in messages(app, cid) if m.role == "assistant"][-1]
        assert (reply.model, reply.model_precision) == ("second", "float32")
        assert reply.model_file.startswith("model.safetensors@")
        page = client.get(f"/chat/c/{cid}").get_data(as_text=True)
        assert 'class="model-name">second</span>' in page and "Model: <strong>second</strong>" in page
        client.post(f"/chat/c/{cid}/share", data={"csrf_token": csrf_of(client, f"/chat/c/{cid}")})
        link = re.search(r"/chat/shared/[\w-]+", client.get(f"/chat/c/{cid}").get_data(as_text=True)).group(0)
        assert "Model: <strong>second</strong>" in app.test_client().get(link).get_data(as_text=True)  # shared too
        inside = client.get(f"/chat/c/{cid}/m/{reply.id}/inside/0.json")
        assert inside.status_code == 200, inside.get_data(as_text=True)
        # who pushed its token: the second model's numbers, worked out on its own kind of job
        split = client.get(f"/chat/c/{cid}/m/{reply.id}/attribution/0.json").get_json()
        second = glassbox(app).core.models["chat:second"].model
        want = reference(second.state_dict(), inside.json["context_ids"], split["token"]["id"], config=second.config)
        assert split["logit"] == pytest.approx(want["logit"], rel=1e-4, abs=1e-4)
        finished = glassbox(app).core.job_metrics.finished  # counted just after the job's end is announced
        assert wait_for(lambda: finished.get(("attribution:second", "done")) == 1)
        # one head over the reply: the second model's weights, on its own kind of job
        head = client.get(f"/chat/c/{cid}/m/{reply.id}/inside/0/head/0.0.json").get_json()
        assert head["weights"][-1] == pytest.approx(inside.json["attention"]["weights"][0][0], abs=1e-6)
        assert wait_for(lambda: finished.get(("head:second", "done")) == 1)
        # the next turn of that conversation is the second model's too
        followed = send(client, "And again", conversation_id=cid, max_new_tokens="4", temperature="0")
        finish(client, followed.get_data(as_text=True))
        assert [m.model for m in messages(app, cid) if m.role == "assistant"] == ["second", "second"]
    finally:
        glassbox(app).core.shutdown()


def test_after_a_restart_without_the_model_its_replies_answer_409_and_never_another_models_numbers(tmp_path,
                                                                                                   registry):
    from tests.support.databases import app_database_url
    database = {"database_url": app_database_url()}  # the restart finds the same history (SQLite: the folder)
    app = app_on(tmp_path, None, registry, **database)
    client = app.test_client()
    try:
        sent = send(client, "Hello", model="second", max_new_tokens="6", temperature="0")
        finish(client, sent.get_data(as_text=True))
        cid = conversation_id_of(sent)
        reply = [m for m in messages(app, cid) if m.role == "assistant"][-1]
        cookie = client.get_cookie("glassbox_session")
    finally:
        glassbox(app).core.shutdown()

    app = app_on(tmp_path, "[models.first]\ncheckpoint = 'first/model.safetensors'\n", registry, **database)
    client = app.test_client()
    client.set_cookie(cookie.key, cookie.value)
    try:
        said = "This reply was written by second, which this server does not run."
        inside = client.get(f"/chat/c/{cid}/m/{reply.id}/inside/0.json")
        assert (inside.status_code, inside.json) == (409, {"error": said})
        page = client.get(f"/chat/c/{cid}/m/{reply.id}/inside/0")
        assert page.status_code == 409 and said in page.get_data(as_text=True)
        split = client.get(f"/chat/c/{cid}/m/{reply.id}/attribution/0.json")
        assert (split.status_code, split.json) == (409, {"error": said})
        tokens = client.get(f"/chat/c/{cid}/m/{reply.id}/tokens")
        assert tokens.status_code == 409 and said in tokens.get_data(as_text=True)
        branched = client.post(f"/chat/c/{cid}/m/{reply.id}/branch",
                               data={"csrf_token": csrf_of(client, f"/chat/c/{cid}"), "index": "0", "token": "65"})
        assert branched.status_code == 409
        regenerated = client.post(f"/chat/c/{cid}/regenerate", data={"csrf_token": csrf_of(client, f"/chat/c/{cid}")})
        assert regenerated.status_code == 409 and said in regenerated.get_data(as_text=True)
        conversation = client.get(f"/chat/c/{cid}").get_data(as_text=True)
        assert "second (not run here now)" in conversation  # the page is still read, its reply labelled
        assert ("This conversation was started with <strong>second</strong>, which this\n    server no longer runs: "
                "new replies come from <strong>first</strong>.") in conversation  # said, not silently switched
        assert "Model: <strong>second</strong>" not in conversation
    finally:
        glassbox(app).core.shutdown()


def test_the_same_file_under_a_new_name_is_the_same_model_and_its_replies_say_so(tmp_path, registry):
    """A model is its file: a registry that renames it keeps every older reply readable (issue 51: renaming the
    bundled model `tiny` in examples/models.toml made every older conversation dead)."""
    from tests.support.databases import app_database_url
    database = {"database_url": app_database_url()}
    app = app_on(tmp_path, None, registry, **database)
    client = app.test_client()
    try:
        sent = send(client, "Hello", model="second", max_new_tokens="4", temperature="0")
        finish(client, sent.get_data(as_text=True))
        cid = conversation_id_of(sent)
        reply = [m for m in messages(app, cid) if m.role == "assistant"][-1]
        before = client.get(f"/chat/c/{cid}/m/{reply.id}/inside/0.json").json
        cookie = client.get_cookie("glassbox_session")
    finally:
        glassbox(app).core.shutdown()
    app = app_on(tmp_path, "[models.first]\ncheckpoint = 'first/model.safetensors'\n"
                           "[models.renamed]\ncheckpoint = 'second/model.safetensors'\n", registry, **database)
    client = app.test_client()
    client.set_cookie(cookie.key, cookie.value)
    try:
        inside = client.get(f"/chat/c/{cid}/m/{reply.id}/inside/0.json")
        flat = lambda report: [w for layer in report["attention"]["weights"] for row in layer for w in row]  # noqa: E731
        assert inside.status_code == 200 and flat(inside.json) == pytest.approx(flat(before), abs=1e-6)  # its own
        page = client.get(f"/chat/c/{cid}").get_data(as_text=True)
        assert 'class="model-name">second (now renamed: the same file)</span>' in page
        assert client.get(f"/chat/c/{cid}/m/{reply.id}/tokens").status_code == 200
    finally:
        glassbox(app).core.shutdown()


@pytest.mark.parametrize("htmx", [True, False])
def test_one_message_asks_two_models_at_once_each_reply_a_version(tmp_path, registry, htmx):
    app = app_on(tmp_path, None, registry)
    try:
        client = app.test_client()
        sent = send(client, "Hello", htmx=htmx, model="first", also_model="second", max_new_tokens="6",
                    temperature="0")
        if htmx:
            html = sent.get_data(as_text=True)
            assert sent.status_code == 200 and 'class="pair"' in html
            assert len(re.findall(r'sse-connect="([^"]+)"', html)) == 2  # both stream, side by side
            assert "beside=" in sent.headers["HX-Push-Url"]
            finish(client, html)
            cid = conversation_id_of(sent)
        else:  # the form waited for both replies, then shows them side by side
            assert sent.status_code == 303 and "beside=" in sent.headers["Location"]
            cid = re.search(r"/chat/c/([0-9a-f]+)", sent.headers["Location"]).group(1)
            html = client.get(sent.headers["Location"]).get_data(as_text=True)
            assert 'class="pair"' in html and "sse-connect" not in html
        replies = [m for m in messages(app, cid) if m.role == "assistant"]
        assert [r.model for r in replies] == ["first", "second"]
        assert replies[0].parent_id == replies[1].parent_id  # two versions of one reply
        assert wait_for(lambda: all(m.status == "complete" for m in messages(app, cid)))
        compare = client.get(f"/chat/c/{cid}/m/{replies[0].id}/compare/{replies[1].id}")
        assert compare.status_code == 200
        sides = re.findall(r'<small class="model-name">([^<]+)</small>', compare.get_data(as_text=True))
        assert sides == ["first", "second"]  # each side names the model that wrote it
        # Regenerate with the other model: a third version, labelled with the model that wrote it
        regenerated = client.post(f"/chat/c/{cid}/regenerate", headers={"HX-Request": "true"},
                                  data={"csrf_token": csrf_of(client, f"/chat/c/{cid}"), "model": "first",
                                        "max_new_tokens": "4"})
        finish(client, regenerated.get_data(as_text=True))
        assert [m.model for m in messages(app, cid) if m.role == "assistant"] == ["first", "second", "first"]
    finally:
        glassbox(app).core.shutdown()


def test_asking_an_unknown_or_the_same_model_twice_is_refused_beside_the_picker_nothing_saved(tmp_path, registry):
    app = app_on(tmp_path, None, registry)
    try:
        client = app.test_client()
        unknown = send(client, "Hello", htmx=False, model="gpt-9")
        assert unknown.status_code == 400 and "There is no model named &#39;gpt-9&#39; here" in unknown.get_data(
            as_text=True)
        same = send(client, "Hello", htmx=False, model="first", also_model="first")
        assert same.status_code == 400 and "Choose another model than first" in same.get_data(as_text=True)
        assert 'id="model-error"' in same.get_data(as_text=True)
        assert "/chat/c/" not in client.get("/chat/").get_data(as_text=True)  # no conversation was saved
        # in a conversation already started, an unknown model is refused alike (it was ignored: a 303)
        sent = send(client, "Hello", model="second", max_new_tokens="2", temperature="0")
        finish(client, sent.get_data(as_text=True))
        cid = conversation_id_of(sent)
        before = len(messages(app, cid))
        again = send(client, "Again", htmx=False, conversation_id=cid, model="gpt-9")
        assert again.status_code == 400 and "There is no model named &#39;gpt-9&#39; here" in again.get_data(
            as_text=True)
        assert len(messages(app, cid)) == before
    finally:
        glassbox(app).core.shutdown()


def test_a_reply_saved_before_replies_kept_their_model_says_so_and_is_read_with_the_default(tmp_path, registry):
    app = app_on(tmp_path, None, registry)
    try:
        client = app.test_client()
        sent = send(client, "Hello", model="first", max_new_tokens="4", temperature="0")
        finish(client, sent.get_data(as_text=True))
        cid = conversation_id_of(sent)
        reply = messages(app, cid)[-1]
        assert "**Assistant** · `first`" in client.get(f"/chat/c/{cid}/export.md").get_data(as_text=True)
        from webapp.chat.web.blueprint import service
        with app.app_context(), service().store.db.transaction() as db:  # as a row from before the migration
            db.execute("UPDATE messages SET model = NULL, model_file = NULL, model_precision = NULL WHERE id = ?",
                       (reply.id,))
        assert 'class="model-name unknown">model not recorded' in client.get(f"/chat/c/{cid}").get_data(as_text=True)
        assert "**Assistant** · model not recorded" in client.get(f"/chat/c/{cid}/export.md").get_data(as_text=True)
        assert client.get(f"/chat/c/{cid}/m/{reply.id}/inside/0.json").status_code == 200
    finally:
        glassbox(app).core.shutdown()
