"""Training a dictionary from the page: the form starts a job on the core, its page streams each step's
progress and ends with the figures, and the dictionary is loaded beside the model at once (a token's features
read it); Stop ends it at the next step; every bad field is a 400 naming it, and nothing runs."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import torch

from tests.chat.ablation import test_pages as test_ablation
from tests.chat.ablation.test_pages import greedy_reply
from tests.conftest import csrf_of, sse_events
from webapp.chat.features import saelens
from webapp.chat.features.sae import Dictionary, DictionaryConfig
from webapp.chat.features.train import STATE
from webapp.chat.features.training import TrainingService
from webapp.web.state import glassbox

chat_app = test_ablation.chat_app  # the fixture: a small model, never sampling a special


def corpus(lines: int = 300) -> bytes:
    return "".join(json.dumps({"user": f"What is {i % 40} + {i % 9}?", "assistant": f"{i % 40 + i % 9}."}) + "\n"
                   for i in range(lines)).encode()


def train(client, data: bytes = b"", filename: str = "c.jsonl", **fields):
    csrf = csrf_of(client, "/chat/dictionaries")
    form = {"csrf_token": csrf, "model": "glassbox", "name": "mine", "layer": "1", "width": "32", "k": "4",
            "tokens": "2048", **fields, "corpus": (io.BytesIO(data or corpus()), filename)}
    return client.post("/chat/dictionaries", data=form, content_type="multipart/form-data")


def test_a_dictionary_trained_from_the_page_streams_its_progress_and_is_loaded(chat_app):
    client = chat_app.test_client()
    started = train(client)
    assert started.status_code == 303, started.get_data(as_text=True)
    job_page = started.headers["Location"]
    assert "Training mine" in client.get(job_page).get_data(as_text=True)
    events = sse_events(client.get(job_page + "/events").get_data(as_text=True))
    assert [name for name, _ in events].count("progress") >= 1 and events[-1][0] == "done"
    assert "explained variance" in events[-1][1] and "loss recovered" in events[-1][1]
    loaded = glassbox(chat_app).core.models["chat"]
    assert "mine" in loaded.dictionaries and loaded.dictionaries["mine"].sae.config.layer == 1
    assert (loaded.dictionaries["mine"].path / "quality.json").exists()
    cid, mid = greedy_reply(client, n=3)
    features = client.get(f"/chat/c/{cid}/m/{mid}/features/1.json").get_json()
    assert [d["name"] for d in features["dictionaries"]] == ["mine"]
    assert "mine" in client.get("/chat/dictionaries").get_data(as_text=True)
    again = train(client)
    assert again.status_code == 409 and "already has a dictionary named" in again.get_data(as_text=True)
    # the next start loads it again from the instance folder, as trained
    weights = loaded.dictionaries.pop("mine").sae.W_enc.detach().clone()
    glassbox(chat_app).service(TrainingService).load_trained()
    assert torch.equal(loaded.dictionaries["mine"].sae.W_enc, weights)


def test_a_start_loads_the_finished_dictionaries_trained_here_and_skips_what_does_not_fit(chat_app, caplog):
    loaded = glassbox(chat_app).core.models["chat"]
    here = Path(chat_app.instance_path) / "dictionaries" / "glassbox"
    for name, d_in, layer in (("fits", 32, 1), ("narrow", 16, 1), ("deep", 32, 7), ("cut-short", 32, 0)):
        saelens.save(Dictionary(DictionaryConfig(d_in, 24, "topk", 4, layer)), here / name)
    (here / "cut-short" / STATE).write_bytes(b"a training stopped by a restart")
    (here / "empty").mkdir()
    with caplog.at_level(logging.WARNING, logger="glassbox"):
        glassbox(chat_app).service(TrainingService).load_trained()
    assert sorted(loaded.dictionaries) == ["fits"]
    assert "narrow" in caplog.text and "d_in is 16" in caplog.text and "deep" in caplog.text
    saelens.save(Dictionary(DictionaryConfig(32, 24, "topk", 4, 0)), here.parent / "other" / "fits")
    with caplog.at_level(logging.WARNING, logger="glassbox"):
        glassbox(chat_app).service(TrainingService).load_trained()  # again: "fits" is taken now
    assert loaded.dictionaries["fits"].layer == 1 and "already has one named 'fits'" in caplog.text


def test_stop_ends_the_training_and_loads_nothing(chat_app):
    client = chat_app.test_client()
    started = train(client, tokens="2000000", data=corpus(3000))
    job_page = started.headers["Location"]
    csrf = csrf_of(client, job_page)
    assert client.post(job_page + "/stop", data={"csrf_token": csrf}).status_code == 303
    events = sse_events(client.get(job_page + "/events").get_data(as_text=True))
    assert events[-1][0] == "done" and "Stopped" in events[-1][1]
    assert "mine" not in (glassbox(chat_app).core.models["chat"].dictionaries or {})
    again = train(client)  # nothing of the stopped one is kept: its name is free
    assert again.status_code == 303, again.get_data(as_text=True)


def test_every_bad_field_is_a_400_naming_it_and_nothing_runs(chat_app):
    client = chat_app.test_client()
    for fields, words in [({"layer": "2"}, "layer must be from 0 to 1"), ({"k": "33"}, "k must be at most the width"),
                          ({"width": "x"}, "width must be a whole number"), ({"name": "a b"}, "name must be"),
                          ({"model": "other"}, "model must be one of"), ({"tokens": "10"}, "tokens must be from 512")]:
        got = train(client, **fields)
        assert got.status_code == 400 and words in got.get_data(as_text=True), (fields, got.status_code)
    assert "not UTF-8" in train(client, data=b"\xff\xfe bad").get_data(as_text=True)
    assert ".txt file" in train(client, filename="corpus.csv").get_data(as_text=True)
    assert not any(j.kind.startswith("train") for j in glassbox(chat_app).core._jobs.values())


def test_a_corpus_too_small_for_one_step_fails_the_job_saying_so(chat_app):
    client = chat_app.test_client()
    started = train(client, data=corpus(5))
    events = sse_events(client.get(started.headers["Location"] + "/events").get_data(as_text=True))
    assert events[-1][0] == "done" and "the corpus ran out before the first step" in events[-1][1]
    assert "mine" not in (glassbox(chat_app).core.models["chat"].dictionaries or {})
