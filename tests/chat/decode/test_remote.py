"""The remote chat executor (webapp/chat/decode/remote/executor.py) against a small fake OpenAI-compatible server
in this process (tests/support/fake_openai.py): settings, back-off and round-robin, the prompt as messages,
logprobs as odds, a reply streamed, a backend that dies mid-reply, Stop closing the connection. Each real
server's wire (llama.cpp, vLLM): tests/chat/decode/test_remote_servers.py. Real gunicorn:
tests/integration/test_remote.py."""

from __future__ import annotations

import math
import threading
import time

import pytest

from tests.support.fake_openai import Fake
from webapp.chat.decode.remote.backends import Backends, parse_backend, read_key
from webapp.chat.decode.remote.executor import RemoteChat
from webapp.chat.decode.remote.wire import TokenMap, messages_of, odds_of
from webapp.chat.decode.types import ChatRequest, SamplingParams
from webapp.core.engine import InferenceCore
from webapp.core.executors import BatchedJobs
from webapp.core.jobs import CANCELLED, DONE, FAILED, Job


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from tests.support.chat_models import tiny_chat_model
    return tiny_chat_model(tmp_path_factory.mktemp("remote-chat"))


def run_reply(loaded, urls, *, wait=5.0, cancel_after=None, max_tokens=50):
    executor = RemoteChat(loaded, Backends(urls, retry_seconds=30), wait_seconds=wait, timeout=5)
    core = InferenceCore({"chat": loaded}, {"chat": executor})
    finished = threading.Event()
    outcome = {}

    def on_finish(job, result, error):
        outcome.update(result=result, error=error, text="".join(job.result.text))
        finished.set()
    ids = loaded.prompt.build([{"role": "user", "content": "Hello"}], max_tokens)
    job = Job("chat", "me", ChatRequest(tuple(ids), SamplingParams(max_tokens, 0.7, 40, 3)), on_finish=on_finish)
    core.submit(job)
    if cancel_after is not None:
        time.sleep(cancel_after)
        job.cancel()
    assert finished.wait(20)
    core.shutdown()
    return job, outcome


# -- settings --------------------------------------------------------------------------------------------
def test_backend_spec_and_key_file(tmp_path):
    assert parse_backend("") == []
    assert parse_backend("openai:http://a:1/v1/, https://b/v1") == ["http://a:1/v1", "https://b/v1"]
    for bad in ("http://a/v1", "openai:", "openai:ftp://a"):
        with pytest.raises(ValueError):
            parse_backend(bad)
    keys = tmp_path / "key"
    keys.write_text("# the key\n\nsk-123  backend\n")
    assert read_key(str(keys)) == "sk-123" and read_key("") == ""


def test_backends_in_turn_skip_a_failed_one_then_check_it():
    now = [0.0]
    pool = Backends(["a", "b", "c"], retry_seconds=10, clock=lambda: now[0])
    assert [u for u, _ in pool.turn()] == ["a", "b", "c"]
    assert [u for u, _ in pool.turn()] == ["b", "c", "a"]
    pool.failed("c")
    assert pool.turn() == [("a", False), ("b", False)]  # c is in its back-off
    now[0] = 11
    assert ("c", True) in pool.turn()  # back-off over: checked with GET /models first
    pool.ok("c")
    assert ("c", False) in pool.turn()


# -- the prompt and the odds ------------------------------------------------------------------------------
def test_the_prompt_goes_as_messages_without_the_local_few_shot(loaded):
    turns = [{"role": "user", "content": "Hello ✓"}, {"role": "assistant", "content": "Hi."},
             {"role": "user", "content": "Again"}]
    assert messages_of(loaded.prompt, loaded.prompt.build(turns, 20)) == turns


def test_logprobs_become_token_odds(loaded):
    tokens = TokenMap(loaded.tokenizer)
    entry = {"token": "a", "logprob": math.log(0.25), "bytes": [97],
             "top_logprobs": [{"token": "b", "logprob": math.log(0.5), "bytes": [98]},
                              {"token": "a", "logprob": math.log(0.25), "bytes": [97]}]}
    odds = odds_of(entry, 97, tokens)
    assert odds.token == 97 and odds.probability == pytest.approx(0.25) and odds.rank == 2
    # not sent by OpenAI's API: worked out from the alternatives (temperature 1, no top-k: renormalized)
    assert odds.sampled_probability == pytest.approx(1 / 3) and odds.entropy_bits == pytest.approx(1.5)
    assert [(i, round(p, 3), round(q, 3)) for i, p, q in odds.alternatives] == [(98, 0.5, 0.667), (97, 0.25, 0.333)]
    greedy = odds_of(entry, 97, tokens, temperature=0.0)
    assert greedy.sampled_probability == 0.0 and [q for _, _, q in greedy.alternatives] == [1.0, 0.0]
    top1 = odds_of(entry, 97, tokens, temperature=0.5, top_k=1)  # the cut inside the list sent: exact
    assert [q for _, _, q in top1.alternatives] == [1.0, 0.0]
    glassbox = odds_of({**entry, "rank": 7, "sampled_probability": 0.125, "entropy_bits": 3.25}, 97, tokens)
    assert (glassbox.rank, glassbox.sampled_probability, glassbox.entropy_bits) == (7, 0.125, 3.25)  # sent: kept
    assert odds_of({"token": "z", "logprob": -1.0, "top_logprobs": []}, 122, tokens).rank is None
    assert tokens.ids("é".encode()) == list("é".encode())  # not one local token: re-tokenized


# -- replies through the core ------------------------------------------------------------------------------
def test_a_reply_streams_with_odds_and_the_request_is_openai_shaped(loaded):
    fake = Fake("Hi ✓")
    job, outcome = run_reply(loaded, [fake.url])
    assert outcome == {"result": DONE, "error": None, "text": "Hi ✓"}
    assert job.result.token_ids == list("Hi ✓".encode())
    first = job.result.odds[0]
    assert first.probability == pytest.approx(0.5) and first.rank == 2 and first.sampled_probability is not None
    body = fake.bodies[0]
    assert body["messages"] == [{"role": "user", "content": "Hello"}] and body["stream"] is True
    assert (body["max_tokens"], body["temperature"], body["top_k"], body["seed"]) == (50, 0.7, 40, 3)
    assert body["logprobs"] is True and body["top_logprobs"] == 10 and "model" not in body
    assert body["stream_options"] == {"include_usage": True}  # the backend's own token count, at the end
    assert len(job.result.token_ids) == 6 and job.result.stats.tokens == 4  # ✓: 1 backend token, 3 bytes here
    fake.shutdown()


def test_the_count_and_the_rate_are_the_backends_usage_not_the_fronts_pieces(loaded, monkeypatch):
    from webapp.chat.decode.remote import executor
    rates = []
    real = executor.decode_rate
    monkeypatch.setattr(executor, "decode_rate", lambda n, first, last: rates.append(n) or real(n, first, last))
    fake = Fake("Hi ✓", usage_tokens=40, delay=0.01)  # what the backend says it wrote: neither 4 nor 6
    job, outcome = run_reply(loaded, [fake.url])
    assert outcome["result"] == DONE and len(job.result.token_ids) == 6
    assert job.result.stats.tokens == 40 and rates == [40]  # tokens/s: 39 tokens after the first, not 5
    fake.shutdown()


def test_a_backend_that_dies_mid_reply_fails_it_clearly_and_keeps_the_text(loaded):
    fake = Fake("Hello world", die_after=5)
    job, outcome = run_reply(loaded, [fake.url])
    assert outcome["result"] == FAILED and outcome["text"] == "Hello"
    assert "stopped mid-reply" in outcome["error"] and fake.url in outcome["error"]
    fake.shutdown()


def test_a_down_backend_is_skipped_for_the_next(loaded):
    fake = Fake("ok")
    down = "http://127.0.0.1:9/v1"  # nothing listens on the discard port
    job, outcome = run_reply(loaded, [down, fake.url])
    assert outcome["result"] == DONE and outcome["text"] == "ok"
    fake.shutdown()


def test_no_backend_fails_after_the_wait_naming_them(loaded):
    down = "http://127.0.0.1:9/v1"
    started = time.monotonic()
    job, outcome = run_reply(loaded, [down], wait=0.5)
    assert outcome["result"] == FAILED and "No chat backend answered" in outcome["error"] and down in outcome["error"]
    assert time.monotonic() - started < 10


def test_a_refusal_is_not_retried(loaded):
    fake = Fake(status=404)
    job, outcome = run_reply(loaded, [fake.url])
    assert outcome["result"] == FAILED and "refused" in outcome["error"] and "no such model" in outcome["error"]
    assert len(fake.bodies) == 1
    fake.shutdown()


def test_stop_closes_the_connection_and_keeps_the_text(loaded):
    fake = Fake("abcdefghijklmnopqrstuvwxyz" * 4, delay=0.05)
    job, outcome = run_reply(loaded, [fake.url], cancel_after=0.6, max_tokens=200)
    assert outcome["result"] == CANCELLED and 0 < len(outcome["text"]) < 104
    assert "abcdefghijklmnopqrstuvwxyz".startswith(outcome["text"][:26])
    fake.shutdown()


def test_the_service_picks_the_remote_executor_when_configured(loaded, tmp_path):
    from webapp.chat import boot
    from webapp.config import Settings
    settings = Settings.from_env({"GLASSBOX_CHAT_BACKEND": "openai:http://127.0.0.1:9/v1",
                                  "GLASSBOX_CHAT_BACKEND_WAIT_SECONDS": "2.5",
                                  "GLASSBOX_CHAT_BACKEND_MAX_REPLIES": "7"})
    executor = boot.executor(loaded, settings)
    assert isinstance(executor, RemoteChat) and isinstance(executor, BatchedJobs)
    assert (executor.max_rows, executor.wait_seconds, executor.backends.urls) == (7, 2.5, ["http://127.0.0.1:9/v1"])
    boot.warm_up(loaded)  # nothing local to warm up: returns at once
    loaded.remote = False
    assert not isinstance(boot.executor(loaded, Settings()), RemoteChat)
    with pytest.raises(ValueError, match="GLASSBOX_CHAT_BACKEND"):
        boot.executor(loaded, Settings(chat_backend="http://no-scheme/v1"))


def test_a_branch_from_a_token_fails_clearly(loaded):
    executor = RemoteChat(loaded, Backends(["http://127.0.0.1:9/v1"]))
    job = Job("chat", "me", ChatRequest((1, 2), SamplingParams(), forced=(65,)))
    with pytest.raises(ValueError, match="remote backend"):
        executor.admit(job)
