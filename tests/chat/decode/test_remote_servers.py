"""A Glassbox front before each real server's wire (tests/support/fake_openai.py reproduces llama-cpp-python's
and vLLM's streams): a front whose tokenizer differs from the backend's, tokens sent without their bytes,
a stream ended by `[DONE]` with no finish_reason, the backend's own finish_reason, and the sampling fields
that make each server sample as Glassbox does. The real servers: bench/peers/engines.py."""

from __future__ import annotations

import threading

import pytest

from tests.support.fake_openai import PENALIZED_TEXT, Fake
from webapp.chat.decode.remote.backends import Backends
from webapp.chat.decode.remote.executor import RemoteChat
from webapp.chat.decode.types import ChatRequest, SamplingParams
from webapp.chat.web.token_views import shade
from webapp.core.engine import InferenceCore
from webapp.core.jobs import DONE, FAILED, Job
from webapp.v1 import shapes
from webapp.v1.params import Ask
from webapp.v1.replies import Follow


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from tests.support.chat_models import tiny_chat_model
    return tiny_chat_model(tmp_path_factory.mktemp("remote-servers"))  # byte-level tokenizer


def replies(loaded, url, n=1, *, max_tokens=50, temperature=0.0, top_k=0, odds=True, stagger=0.0, executor=None):
    """n replies at once through a RemoteChat (`executor`, else one on `url`) -> [(job, outcome)]."""
    import time
    executor = executor or RemoteChat(loaded, Backends([url]), wait_seconds=5, timeout=5)
    core = InferenceCore({"chat": loaded}, {"chat": executor})
    done, outcomes, jobs = threading.Semaphore(0), {}, []
    ids = loaded.prompt.build([{"role": "user", "content": "Hello"}], max_tokens)
    for i in range(n):
        def on_finish(job, result, error, i=i):
            outcomes[i] = {"result": result, "error": error, "text": "".join(job.result.text)}
            done.release()
        job = Job("chat", "me", ChatRequest(tuple(ids), SamplingParams(max_tokens, temperature, top_k, None), odds),
                  on_finish=on_finish)
        jobs.append(job)
        core.submit(job)
        time.sleep(stagger)
    for _ in range(n):
        assert done.acquire(timeout=20)
    core.shutdown()
    return [(job, outcomes[i]) for i, job in enumerate(jobs)]


def rendered(loaded, job) -> None:
    """What the chat page and /v1 do with every token's odds (a None probability raised TypeError)."""
    for odds in job.result.odds:
        assert odds.probability is not None and 0 <= shade(odds.probability)
    tokens = [(0, odds.token, odds) for odds in job.result.odds]
    shapes.chat_logprobs(tokens, 10, loaded.tokenizer)
    shapes.text_logprobs(tokens, 5, loaded.tokenizer)


# -- 1. a front whose tokenizer is not the backend's ---------------------------------------------------
@pytest.mark.parametrize("style", ["openai", "vllm"])
def test_remote_tokens_split_locally_all_have_odds(loaded, style):
    fake = Fake("Café ✓ ok", style=style)  # one remote token per character; locally é is 2 bytes, ✓ 3
    [(job, outcome)] = replies(loaded, fake.url)
    assert outcome == {"result": DONE, "error": None, "text": "Café ✓ ok"}
    assert job.result.token_ids == list("Café ✓ ok".encode())
    rendered(loaded, job)
    e = "Caf".__len__()
    first, rest = job.result.odds[e], job.result.odds[e + 1]
    assert first.probability == pytest.approx(0.5)  # the remote token's odds on its first local piece
    assert (rest.probability, rest.sampled_probability, rest.rank) == (1.0, 1.0, 1)  # the rest: certain
    fake.shutdown()


# -- 3. tokens without their bytes ------------------------------------------------------------------------
def test_vllm_tokens_of_a_split_character_take_its_bytes_from_the_text(loaded):
    fake = Fake("Café!", style="vllm", split="bytes")  # é's two byte tokens: U+FFFD as their bytes
    [(job, outcome)] = replies(loaded, fake.url)
    assert outcome["result"] == DONE and outcome["text"] == "Café!"
    assert job.result.token_ids == list("Café!".encode())  # exact: each byte token with its own odds
    assert [round(o.probability, 3) for o in job.result.odds] == [0.5] * 6
    rendered(loaded, job)
    fake.shutdown()


def test_llamacpp_tokens_without_bytes_are_kept_and_the_backends_length_is_the_finish(loaded):
    fake = Fake("Café!", style="llamacpp", split="bytes", finish="length")  # "" and bytes null for é's bytes
    [(job, outcome)] = replies(loaded, fake.url, max_tokens=6)
    assert outcome["result"] == DONE
    assert outcome["text"] == "Caf!"  # llama-cpp-python's stream never carries é: what it sent is kept
    # both tokens of é kept (as U+FFFD's local tokens, with their odds), none dropped
    assert len(job.result.token_ids) >= 6 and [o.probability for o in job.result.odds].count(0.5) >= 6
    rendered(loaded, job)
    assert job.result.stop_reason == "length"
    ask = Ask("chat", tuple(job.request.prompt_ids), SamplingParams(6, 0.0, 0, None))
    follow = Follow(job, ask, 1.0)
    follow.generated = 5  # what /v1 counted before: fewer than max_tokens, so it said "stop"
    assert follow.finish_reason() == "length"
    fake.shutdown()


def test_llamacpps_rank_is_only_among_its_top_ten(loaded):
    fake = Fake("ab", style="llamacpp")  # the chosen token sent after ten others: its rank is unknown
    [(job, _)] = replies(loaded, fake.url)
    assert [o.rank for o in job.result.odds] == [None, None]
    assert job.result.odds[0].alternatives[0][0] == ord("x")
    fake.shutdown()


# -- 2. a stream cut short ---------------------------------------------------------------------------------
def test_done_without_a_finish_reason_is_never_a_complete_reply(loaded):
    fake = Fake("abcdefghijklmnopqrstuvwxyz", style="llamacpp", interrupt=True, delay=0.03)
    (first, one), (second, two) = replies(loaded, fake.url, 2, stagger=0.3)  # the second interrupts the first
    assert one["result"] == FAILED and "cut short" in one["error"] and fake.url in one["error"]
    assert 0 < len(one["text"]) < 26 and "abcdefghijklmnopqrstuvwxyz".startswith(one["text"])  # text kept
    assert two == {"result": DONE, "error": None, "text": "abcdefghijklmnopqrstuvwxyz"}
    fake.shutdown()


@pytest.mark.parametrize("server, slots, replies_at_once", [
    ("llama-cpp-python", None, 1),  # one at a time: its default cuts a running reply short for a new one
    ("llama-server", 2, 2),  # its -np, said in GET /props
    ("another server", None, 64),  # says nothing: GLASSBOX_CHAT_BACKEND_MAX_REPLIES
])
def test_replies_beyond_the_backends_slots_wait_in_the_front_and_every_one_completes(loaded, server, slots,
                                                                                     replies_at_once):
    """8 users at once on llama-cpp-python's defaults: 1 reply completed, 7 failed (issue 52)."""
    from webapp.chat.decode.remote.executor import remote_executor
    from webapp.config import Settings
    fake = Fake("abcdefghij", style="llamacpp" if server == "llama-cpp-python" else "openai",
                interrupt=server == "llama-cpp-python", delay=0.01, slots=slots)
    executor = remote_executor(loaded, Settings(chat_backend=f"openai:{fake.url}", chat_backend_timeout=5,
                                                chat_backend_wait_seconds=5))
    assert executor.max_rows == replies_at_once
    outcomes = replies(loaded, fake.url, 8, executor=executor)
    assert [o for _, o in outcomes] == [{"result": DONE, "error": None, "text": "abcdefghij"}] * 8
    assert fake.most <= replies_at_once
    fake.shutdown()


@pytest.mark.parametrize("n_ctx_windows, replies_at_once", [(None, 4), (2.5, 2), (0.5, 1), (8, 4)])
def test_no_more_replies_than_a_llama_server_s_shared_context_holds(loaded, n_ctx_windows, replies_at_once):
    """llama-server on its default flags: 4 slots sharing one cache of n_ctx tokens. A real one (the bundled model's
    GGUF, n_ctx 1,024, the window 1,024) failed 8 replies of 8 at once with "Context size has been exceeded"
    (bench/peers/llamacpp_server.py); no more run at once than n_ctx holds windows."""
    from webapp.chat.decode.remote.executor import remote_executor
    from webapp.config import Settings
    n_ctx = None if n_ctx_windows is None else int(n_ctx_windows * loaded.block_size)
    fake = Fake("abc", slots=4, n_ctx=n_ctx)
    executor = remote_executor(loaded, Settings(chat_backend=f"openai:{fake.url}"))
    assert executor.max_rows == replies_at_once
    fake.shutdown()


def test_a_configured_slot_count_wins_and_a_failure_always_says_why(loaded):
    from webapp.chat.decode.remote.executor import remote_executor
    from webapp.config import Settings
    fake = Fake("abc", slots=4)
    executor = remote_executor(loaded, Settings(chat_backend=f"openai:{fake.url}", chat_backend_slots=3))
    assert executor.max_rows == 3 and executor.backends.slots == {fake.url: 3}
    fake.shutdown()
    dead = Fake("abc", die_after=1)
    [(_, outcome)] = replies(loaded, dead.url)
    assert outcome["result"] == FAILED and dead.url in outcome["error"] and "stopped mid-reply" in outcome["error"]
    dead.shutdown()


# -- 4. sampling as Glassbox samples ------------------------------------------------------------------------
@pytest.mark.parametrize("style", ["llamacpp", "vllm"])
def test_a_greedy_reply_is_sampled_as_here(loaded, style):
    fake = Fake("Same text", style=style, top_k_wanted=0)  # top_k 0: the whole vocabulary, as asked
    [(job, outcome)] = replies(loaded, fake.url, temperature=0.0, top_k=0)
    assert outcome["text"] == "Same text" != PENALIZED_TEXT
    body = fake.bodies[0]
    assert (body["top_k"], body["top_p"], body["min_p"], body["repeat_penalty"], body["repetition_penalty"]) == \
        (0, 1.0, 0.0, 1.0, 1.0)
    fake.shutdown()


def test_no_odds_asked_streams_text_with_no_odds(loaded):
    fake = Fake("Café", style="llamacpp")
    [(job, outcome)] = replies(loaded, fake.url, odds=False)
    assert outcome["text"] == "Café" and job.result.token_ids == list("Café".encode())
    assert "logprobs" not in fake.bodies[0]
    fake.shutdown()


# -- 5. the reply's length in the backend's tokens ------------------------------------------------------------
def test_without_usage_the_count_is_the_backends_tokens_seen_in_their_logprobs(loaded):
    fake = Fake("Café ✓", style="llamacpp")  # llama-cpp-python: no usage; é and ✓ one token each there
    [(job, outcome)] = replies(loaded, fake.url)
    assert outcome["result"] == DONE and len(job.result.token_ids) > 6
    assert job.result.stats.tokens == 6
    fake.shutdown()


def test_llamacpp_servers_timings_give_the_count(loaded):
    fake = Fake("Café", style="llamacpp", timings=9)  # llama.cpp's server: predicted_n with the last chunk
    [(job, _)] = replies(loaded, fake.url)
    assert job.result.stats.tokens == 9
    fake.shutdown()


@pytest.mark.parametrize("style", ["openai", "vllm"])
def test_usage_is_the_count_even_without_odds_and_the_fronts_v1_says_it(loaded, style):
    fake = Fake("Café", style=style, usage_tokens=3)
    [(job, _)] = replies(loaded, fake.url, odds=False)
    assert job.result.token_ids == list("Café".encode()) and job.result.stats.tokens == 3
    follow = Follow(job, Ask("chat", tuple(job.request.prompt_ids), SamplingParams(50, 0.0, 0, None)), 1.0)
    follow.generated = 5  # the pieces /v1 sent on
    assert follow.usage()["completion_tokens"] == 3
    fake.shutdown()


def test_a_backend_that_says_nothing_leaves_the_fronts_own_count(loaded):
    fake = Fake("Café", style="llamacpp")  # no usage, no timings, no odds asked: only the pieces seen here
    [(job, _)] = replies(loaded, fake.url, odds=False)
    assert job.result.stats.tokens == len("Café".encode()) and job.result.backend_tokens is None
    fake.shutdown()
