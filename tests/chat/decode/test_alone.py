"""The whole-reply executor (models without a KV cache): a branch's given first tokens start its reply."""

from __future__ import annotations

from tests.chat.decode.test_batched import LONG, drain
from tests.chat.decode.test_generate import tiny
from webapp.chat.decode.alone import ChatAlone
from webapp.chat.decode.generate import generate
from webapp.chat.decode.types import ChatRequest, SamplingParams
from webapp.core import InferenceCore, Job


def test_a_branch_without_a_kv_cache_starts_with_its_given_tokens():
    loaded = tiny(kv=False, config=LONG)
    given = (5, 6, 7)
    request = ChatRequest((1, 2, 3), SamplingParams(max_new_tokens=10, temperature=0.0, top_k=0), forced=given)
    core = InferenceCore({"chat": loaded}, {"chat": ChatAlone(loaded)})
    try:
        job = core.submit(Job("chat", "me", request))
        drain(job)
    finally:
        core.shutdown()
    expected = [p.token for p in generate(loaded, request.prompt_ids, max_new_tokens=10, temperature=0.0,
                                          forced=given) if p.token is not None]
    assert job.result.token_ids[:3] == list(given) and job.result.given == 3
    assert job.result.token_ids == expected
