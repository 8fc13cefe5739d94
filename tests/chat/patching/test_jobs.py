"""Patching jobs on the shared core: running replies stay bit for bit the same with patching jobs between
their steps, the replies really step while one runs, and its cells are published batch by batch."""

from __future__ import annotations

import dataclasses
import time

from tests.chat.decode.test_batched import LONG, alone, drain, requests
from tests.chat.decode.test_generate import tiny
from tests.conftest import wait_for
from webapp.chat.decode.batched import ChatBatch
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.patching.jobs import PatchingJobs, PatchingRequest
from webapp.core import InferenceCore, Job
from webapp.core.jobs import DONE
from webapp.core.sharing import BATCH_SLICE_SECONDS


def test_running_replies_stay_bit_for_bit_the_same_with_patching_jobs_between_their_steps():
    loaded = tiny(config=LONG, endless=True)
    # a patching block takes longer than the core's batch slice, so the batch steps inside the job whatever
    # the machine's speed (a reply's decode step runs the block in one call, never ln_2's module)
    for block in loaded.model.transformer.h:
        block.ln_2.register_forward_hook(lambda *a: time.sleep(2 * BATCH_SLICE_SECONDS))
    reqs = [dataclasses.replace(r, params=dataclasses.replace(r.params, max_new_tokens=300)) for r in requests(4)]
    core = InferenceCore({"chat": loaded}, {"chat": ChatBatch(loaded, 8, PrefixCache(2**30)),
                                            "patching": PatchingJobs(loaded, batch_tokens=16)})
    try:
        replies = [core.submit(Job("chat", f"user{i}", r, orphan_seconds=600)) for i, r in enumerate(reqs)]
        assert wait_for(lambda: all(len(getattr(j.result, "token_ids", [])) >= 2 for j in replies), timeout=30)
        clean = tuple((11 * j) % 256 for j in range(12))
        corrupted = clean[:8] + (1, 2) + clean[10:]
        job = core.submit(Job("patching", "viewer", PatchingRequest(clean, corrupted, 5, 6, 0)))
        assert wait_for(lambda: job.state == "running", timeout=30)
        before = sum(len(j.result.token_ids) for j in replies)
        drain(job)
        during = sum(len(j.result.token_ids) for j in replies) - before
        for reply in replies:
            drain(reply)
    finally:
        core.shutdown()
    assert job.state == DONE and [j.state for j in replies] == [DONE] * 4, [(j.state, j.error) for j in replies]
    assert during > 0  # the replies really stepped while the patching job ran
    cells = [e for e in job.events if e.name == "cells"]
    assert len(cells) > 2 * LONG.n_layer  # batch by batch, not all at the end
    patching = job.result.patching
    assert all(v is not None for row in patching.residual + patching.heads for v in row)
    for reply, request in zip(replies, reqs):
        assert reply.result.token_ids == alone(loaded, request)
