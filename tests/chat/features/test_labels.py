"""Labels people write for features (webapp/chat/features/labels.py) and the searches: a written label is shown
everywhere the automatic one was, to everyone on the server, kept per dictionary fingerprint; a search by label
finds written and automatic labels; a typed text's features are each token's encode; every bad input is a 4xx
that saves nothing."""

from __future__ import annotations

import pytest
import torch
from markupsafe import escape

from tests.chat.ablation import test_pages as test_ablation
from tests.chat.ablation.test_pages import greedy_reply
from tests.chat.features.test_pages import with_early_dictionary
from tests.chat.steering.test_pages import by_hand, gpt
from tests.conftest import csrf_of
from webapp.chat.features.labels import LABEL_CHARS
from webapp.chat.features.service import FeatureService
from webapp.web.state import glassbox

PAGE = "/chat/features/glassbox/early"
chat_app = test_ablation.chat_app  # the fixture: a model whose heads matter, never sampling a special


def write(client, index: int, label: str):
    return client.post(f"{PAGE}/{index}/label", data={"csrf_token": csrf_of(client, f"{PAGE}/{index}"),
                                                       "label": label})


def test_a_written_label_is_shown_to_everyone_instead_of_the_automatic_one(chat_app, tmp_path):
    with_early_dictionary(chat_app, tmp_path)
    client, colleague = chat_app.test_client(), chat_app.test_client()
    cid, mid = greedy_reply(client, n=4)
    reading = client.get(f"/chat/c/{cid}/m/{mid}/features/2.json").get_json()["dictionaries"][0]["features"]
    feature = reading[0]["index"]
    automatic = client.get(f"{PAGE}/{feature}.json").get_json()["label"]
    assert automatic.startswith("pushes ")
    saved = write(client, feature, "  sums   that carry  ")
    assert saved.status_code == 303 and saved.headers["Location"].endswith(f"{PAGE}/{feature}")
    mine = client.get(f"{PAGE}/{feature}.json").get_json()
    assert (mine["label"], mine["automatic_label"]) == ("sums that carry", automatic)  # spaces folded
    assert mine["written_label"] == {"text": "sums that carry", "by_you": True}
    theirs = colleague.get(f"{PAGE}/{feature}.json").get_json()
    assert theirs["label"] == "sums that carry" and theirs["written_label"]["by_you"] is False
    page = colleague.get(f"{PAGE}/{feature}").get_data(as_text=True)
    assert "<strong>sums that carry</strong>" in page and "Labelled by someone on this server" in page
    assert str(escape(automatic)) in page  # the automatic one stays on the page
    # the token's features and its panel say it too
    again = client.get(f"/chat/c/{cid}/m/{mid}/features/2.json").get_json()["dictionaries"][0]["features"]
    assert [f["label"] for f in again if f["index"] == feature] == ["sums that carry"]
    assert "sums that carry" in client.get(f"/chat/c/{cid}/m/{mid}/tokens/2").get_data(as_text=True)
    # blank: back to the automatic label
    assert write(colleague, feature, "   ").status_code == 303
    assert client.get(f"{PAGE}/{feature}.json").get_json()["written_label"] is None
    assert client.get(f"{PAGE}/{feature}.json").get_json()["label"] == automatic


def test_a_label_written_for_another_training_of_the_dictionary_is_not_shown(chat_app, tmp_path):
    with_early_dictionary(chat_app, tmp_path)
    labels = glassbox(chat_app).service(FeatureService).written
    labels.write("glassbox", "early", "another-fingerprint", 3, "from an older training", "someone")
    data = chat_app.test_client().get(f"{PAGE}/3.json").get_json()
    assert data["written_label"] is None and data["label"].startswith("pushes ")


@pytest.mark.parametrize("label, words", [
    ("x" * (LABEL_CHARS + 1), f"at most {LABEL_CHARS} characters"),
    ("two\nlines", "one line of text"),
    ("a\u200bhidden", "without control characters"),
])
def test_a_label_that_cannot_be_saved_says_why_and_saves_nothing(chat_app, tmp_path, label, words):
    with_early_dictionary(chat_app, tmp_path)
    client = chat_app.test_client()
    form = write(client, 3, label)
    assert form.status_code == 303
    assert str(escape(words)) in client.get(form.headers["Location"]).get_data(as_text=True)
    answer = client.post(f"{PAGE}/3/label.json", json={"label": label})
    assert answer.status_code == 400 and words in answer.get_json()["error"]
    assert client.get(f"{PAGE}/3.json").get_json()["written_label"] is None
    assert client.post(f"{PAGE}/3/label.json", json={"name": "x"}).status_code == 400
    assert client.post(f"{PAGE}/3/label.json", json={"label": 5}).status_code == 400
    lone = client.post(f"{PAGE}/3/label.json", data='{"label": "a\\ud800b"}', content_type="application/json")
    assert lone.status_code == 400  # a lone surrogate: no text a database can keep
    assert client.post(f"{PAGE}/3/label", data={"csrf_token": csrf_of(client, f"{PAGE}/3")}).status_code == 400
    assert client.post(f"{PAGE}/3/label.json", data={"label": "x"}).status_code == 415  # JSON only
    assert client.post(f"{PAGE}/48/label.json", json={"label": "x"}).status_code == 404  # no such feature
    assert client.post("/chat/features/glassbox/nope/3/label.json", json={"label": "x"}).status_code == 404
    assert client.post(f"{PAGE}/3/label", data={"label": "no token"}).status_code == 403  # no CSRF token


def test_the_search_finds_written_labels_first_then_automatic_ones(chat_app, tmp_path):
    loaded = with_early_dictionary(chat_app, tmp_path)
    client = chat_app.test_client()
    automatic = loaded.dictionaries["early"].labels
    assert client.post(f"{PAGE}/7/label.json", json={"label": "Carry digit"}).status_code == 200
    found = client.get("/chat/features/glassbox/search.json?q=carry").get_json()
    assert found["query"] == "carry" and found["features"][0] == {"dictionary": "early", "index": 7,
                                                                   "label": "Carry digit", "written": True}
    # an automatic label's words: every feature whose label holds them, in index order
    word = automatic[0].split("'")[1]
    wanted = [i for i, label in enumerate(automatic) if word.casefold() in label.casefold()]
    listed = client.get("/chat/features/glassbox/search.json", query_string={"q": word}).get_json()["features"]
    assert [f["index"] for f in listed if not f["written"]] == [i for i in wanted if i != 7][:50]
    page = client.get("/chat/features/glassbox/search?q=carry").get_data(as_text=True)
    assert f'href="{PAGE}/7"' in page and "Carry digit" in page
    assert "No feature" in client.get("/chat/features/glassbox/search?q=zzqqzz").get_data(as_text=True)
    assert client.get("/chat/features/glassbox/search.json?q=" + "x" * (LABEL_CHARS + 1)).status_code == 400
    assert client.get("/chat/features/nope/search.json?q=x").status_code == 404


def test_a_typed_texts_features_are_each_tokens_encode_of_the_stream_at_its_place(chat_app, tmp_path):
    loaded = with_early_dictionary(chat_app, tmp_path)
    sae = loaded.dictionaries["early"].sae
    client = chat_app.test_client()
    text = "Hi, Paris"
    data = client.get("/chat/features/glassbox/text.json", query_string={"text": text}).get_json()
    ids = list(loaded.tokenizer.encode_ordinary(text))
    assert data["text"] == text and len(data["tokens"]) == len(ids)
    streams = by_hand(gpt(chat_app), [loaded.prompt.bos, *ids])  # the start token first, as a corpus is read
    weights = {k: v.detach() for k, v in sae.state_dict().items()}
    for place, token in enumerate(data["tokens"], start=1):
        (reading,) = token["dictionaries"]
        pre = torch.relu((streams[0][place] - weights["b_dec"]) @ weights["W_enc"] + weights["b_enc"])
        kth = pre.topk(sae.config.k).values[-1]
        want = {int(i): float(pre[i]) for i in torch.nonzero((pre >= kth) & (pre > 0))[:, 0]}
        assert {f["index"]: f["activation"] for f in reading["features"]} == pytest.approx(want, abs=1e-4)
    assert data["tokens"][-1]["token"] == "s"  # byte tokens: the text's last letter
    page = client.get("/chat/features/glassbox/search", query_string={"text": text}).get_data(as_text=True)
    first = data["tokens"][0]["dictionaries"][0]["features"][0]["index"]
    assert f'href="{PAGE}/{first}"' in page and "<code>H</code>" in page
    assert '<span class="muted">space</span>' in page  # a blank token is named, not drawn empty
    too_long = client.get("/chat/features/glassbox/text.json", query_string={"text": "x" * 65})
    assert too_long.status_code == 400 and "at most 64" in too_long.get_json()["error"]
    assert client.get("/chat/features/glassbox/text.json?text=").status_code == 400
    assert client.get("/chat/features/glassbox/search?text=" + "x" * 65).status_code == 400
    assert client.get("/chat/features/nope/text.json?text=x").status_code == 404
