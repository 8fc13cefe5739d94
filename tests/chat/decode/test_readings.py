"""Features read in the decode step (webapp/chat/decode/readings.py): every sampled token's readings, by each of the
model's dictionaries, are the dictionary's encode of the stream after its block at the position that sampled the
token, alone or in a batch with other replies; a reply that keeps no odds reads none; what is saved with a reply
reads back only for the dictionaries as they are now."""

from __future__ import annotations

import pytest
import torch

from tests.chat.decode.test_batched import LONG, batched, requests
from tests.chat.decode.test_generate import tiny
from webapp.chat.decode import readings
from webapp.chat.decode.generate import generate
from webapp.chat.decode.types import ChatRequest
from webapp.chat.features import saelens
from webapp.chat.features.dictionaries import load_dictionaries
from webapp.chat.features.sae import Dictionary, DictionaryConfig
from webapp.chat.model import hooked
from webapp.core.jobs import DONE


def with_dictionaries(loaded, folder, layers=(("early", 0), ("late", 1))):
    """The model with a TopK dictionary after each of these blocks, written and loaded as the app does."""
    d_in = loaded.model.config.n_embd
    for seed, (name, layer) in enumerate(layers):
        torch.manual_seed(seed)
        sae = Dictionary(DictionaryConfig(d_in, 40, "topk", 5, layer, model_name="glassbox"))
        with torch.no_grad():
            sae.b_enc.normal_(0, 0.3)
        saelens.save(sae, folder / name)
    spec = ",".join(str(folder / name) for name, _ in layers)
    loaded.dictionaries = load_dictionaries(spec, "", loaded.model, loaded.tokenizer)
    return loaded


@torch.inference_mode()
def by_forward(loaded, ids: list[int]) -> tuple[readings.Reading, ...]:
    """The readings at the last of `ids`, from the model's forward (not its serving paths), encoded by hand."""
    m = loaded.model
    out = hooked.run(m, hooked.embed(m, torch.tensor([ids])), reads=hooked.Reads(resid=True))
    found = []
    for d in loaded.dictionaries.values():
        sd = {k: v.detach() for k, v in d.sae.state_dict().items()}
        pre = torch.relu((out.resid[d.layer + 1][0, -1] - sd["b_dec"]) @ sd["W_enc"] + sd["b_enc"])
        top = pre.topk(d.sae.config.k)
        found.append(readings.Reading(d.name, d.hook_name, tuple(
            (int(i), float(a)) for a, i in zip(top.values, top.indices) if a > 0)))
    return tuple(found)


def same(got, want) -> None:
    assert got is not None
    assert [r.dictionary for r in got] == [r.dictionary for r in want]
    for g, w in zip(got, want):
        assert [i for i, _ in g.features] == [i for i, _ in w.features]
        assert [a for _, a in g.features] == pytest.approx([a for _, a in w.features], abs=1e-4)


def reply(loaded, prompt, n, **kw) -> tuple[list[int], list | None]:
    """(the reply's tokens, what its last piece says the dictionaries read at each)."""
    pieces = list(generate(loaded, prompt, max_new_tokens=n, temperature=kw.pop("temperature", 0), **kw))
    return [p.token for p in pieces if p.token is not None], pieces[-1].readings


def test_each_sampled_token_has_what_every_dictionary_read_where_it_was_sampled(tmp_path):
    loaded = with_dictionaries(tiny(config=LONG, endless=True), tmp_path)
    prompt = [(9 * j + 4) % 256 for j in range(70)]  # several prefill chunks
    n = readings.READ_EVERY + 7  # read in two goes: READ_EVERY tokens at a time, the rest at the end
    tokens, found = reply(loaded, prompt, n, features=True)
    assert len(tokens) == n and found is not None and len(found) == n
    for i in range(n):
        same(found[i], by_forward(loaded, prompt + tokens[:i]))
        assert all(r.fingerprint == loaded.dictionaries[r.dictionary].fingerprint for r in found[i])
    plain, nothing = reply(loaded, prompt, 3)
    assert nothing is None  # not asked for: nothing tapped, nothing read
    assert plain == tokens[:3]  # and reading them changed no token
    branch, read = reply(loaded, prompt, 5, features=True, forced=tokens[:2])
    assert branch == tokens[:5] and read is not None
    assert read[:2] == [None, None]  # given, not sampled: read by a job when asked
    for i in (2, 3, 4):
        same(read[i], found[i])


def test_a_reply_in_a_batch_reads_what_it_reads_alone(tmp_path):
    loaded = with_dictionaries(tiny(config=LONG, endless=True), tmp_path)
    reqs = [ChatRequest(r.prompt_ids, r.params, features=i != 2) for i, r in enumerate(requests(5))]
    jobs, sizes = batched(loaded, reqs)
    assert max(sizes) >= 3 and all(job.state == DONE for job in jobs)
    for i, (job, request) in enumerate(zip(jobs, reqs)):
        p = request.params
        _, alone = reply(loaded, request.prompt_ids, p.max_new_tokens, temperature=p.temperature, top_k=p.top_k,
                         seed=p.seed, features=True)
        if i == 2:
            assert job.result.features == []  # not asked for: nothing read
            continue
        assert len(job.result.features) == len(alone)
        for got, want in zip(job.result.features, alone):
            same(got, want)


def test_saved_readings_read_back_for_the_dictionaries_as_they_are_now(tmp_path):
    loaded = with_dictionaries(tiny(config=LONG, endless=True), tmp_path)
    _, tokens = reply(loaded, [5, 6, 7], 4, features=True)
    tokens[2] = None  # a token typed into a branch: nothing read
    column = readings.saved(tokens)
    assert column is not None
    dictionaries = loaded.dictionaries
    for index in (0, 1, 3):
        same(readings.saved_reading(column, index, dictionaries), tokens[index])
    assert readings.saved_reading(column, 2, dictionaries) is None
    assert readings.saved_reading(column, 4, dictionaries) is None  # past the reply
    assert readings.saved([None, None]) is None
    retrained = with_dictionaries(tiny(config=LONG, endless=True), tmp_path / "again", (("early", 0), ("late", 0)))
    assert readings.saved_reading(column, 0, retrained.dictionaries) is None  # "late" is another dictionary now
    more = with_dictionaries(tiny(config=LONG, endless=True), tmp_path, (("early", 0), ("late", 1), ("new", 1)))
    assert readings.saved_reading(column, 0, more.dictionaries) is None  # "new" read nothing then
    assert readings.saved_reading({"tokens": "no"}, 0, dictionaries) is None


def test_a_dictionary_that_fails_leaves_the_features_unread_and_the_reply_whole(tmp_path, monkeypatch, caplog):
    loaded = with_dictionaries(tiny(config=LONG, endless=True), tmp_path)
    plain, _ = reply(loaded, [5, 6, 7], 6)

    def broken(*args, **kwargs):
        raise RuntimeError("a dictionary that cannot encode")
    monkeypatch.setattr(readings, "read", broken)
    tokens, found = reply(loaded, [5, 6, 7], 6, features=True)
    assert tokens == plain and found == [None] * 6  # read later by a job, when asked
    assert "features failed" in caplog.text
