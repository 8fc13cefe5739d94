"""Whole-reply lens jobs on the shared core: running replies stay bit for bit the same with lens jobs between
their steps (one reading a kept KV cache, one with parts switched off), and the replies really step while
one runs."""

from __future__ import annotations

import dataclasses
import time

import torch

from tests.chat.decode.test_batched import LONG, alone, drain, requests
from tests.chat.decode.test_generate import tiny
from tests.conftest import wait_for
from webapp.chat.ablation.compute import Parts
from webapp.chat.decode.batched import ChatBatch
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.lens.jobs import LensJobs, LensRequest
from webapp.chat.model.gpt import Chunk
from webapp.core import InferenceCore, Job
from webapp.core.jobs import DONE
from webapp.core.sharing import BATCH_SLICE_SECONDS


def test_running_replies_stay_bit_for_bit_the_same_with_lens_jobs_between_their_steps():
    loaded = tiny(config=LONG, endless=True)
    # each block of a lens job takes longer than the core's batch slice, so the batch steps inside the job
    # whatever the machine's speed (a reply's decode step runs the block in one call, never ln_2's module)
    for block in loaded.model.transformer.h:
        block.ln_2.register_forward_hook(lambda *a: time.sleep(2 * BATCH_SLICE_SECONDS))
    reqs = [dataclasses.replace(r, params=dataclasses.replace(r.params, max_new_tokens=200)) for r in requests(4)]
    prefix = PrefixCache(2**30)
    prompt, reply = tuple((13 * j) % 256 for j in range(200)), tuple((7 * j + 1) % 256 for j in range(40))
    cache = loaded.model.new_cache()  # a finished reply's KV cache, kept for its conversation's next turn
    with torch.inference_mode():
        loaded.model.prefill([Chunk(list(prompt + reply[:-1]), cache, 0, logits=False)])
    core = InferenceCore({"chat": loaded}, {"chat": ChatBatch(loaded, 8, prefix), "lens": LensJobs(loaded, prefix)})
    replies: list = []
    try:
        jobs, during = [], []
        for parts in (None, Parts(heads=((0, 1),), mlps=(1,), mode="mean")):
            # replies of their own for each lens job: running when it starts, however fast the machine ran the
            # last one (read only at the end: not abandoned as orphans meanwhile, however slow the machine)
            running = [core.submit(Job("chat", f"user{i}", r, orphan_seconds=600)) for i, r in enumerate(reqs)]
            replies += running
            assert wait_for(lambda running=running: all(len(getattr(j.result, "token_ids", [])) >= 2 for j in running),
                            timeout=30)
            # kept once the replies have opened their own caches (a starting reply takes one sharing its first
            # token)
            prefix.put(cache, list(prompt + reply[:-1]), loaded.model)
            job = core.submit(Job("lens", "viewer", LensRequest(prompt, reply, parts)))
            assert wait_for(lambda job=job: job.state == "running", timeout=30)
            before = sum(len(j.result.token_ids) for j in running)
            drain(job)
            during.append(sum(len(j.result.token_ids) for j in running) - before)
            jobs.append(job)
        for job in replies:
            drain(job)
    finally:
        core.shutdown()
    assert [(j.state, j.error) for j in jobs + replies] == [(DONE, None)] * 10
    assert [j.result.report.reused_positions for j in jobs] == [len(prompt) - 1, 0]  # an edited run reads none
    assert all(len(row) == len(reply) for j in jobs for row in j.result.report.top)
    assert min(during) > 0  # the replies really stepped while each lens job ran
    for job, request in zip(replies, reqs + reqs):
        assert job.result.token_ids == alone(loaded, request)
