"""Inside jobs on the shared core: running replies stay bit for bit the same with Inside jobs between their
steps, and the replies really step while an Inside job runs."""

from __future__ import annotations

import dataclasses
import time

from tests.chat.decode.test_batched import LONG, alone, drain, requests
from tests.chat.decode.test_generate import tiny
from tests.conftest import wait_for
from webapp.chat.decode.batched import ChatBatch
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.inside.jobs import InsideJobs, InsideRequest
from webapp.core import InferenceCore, Job
from webapp.core.jobs import DONE
from webapp.core.sharing import BATCH_SLICE_SECONDS


# -- a running reply is unchanged by Inside jobs interleaved with it ------------------------------------
def test_running_replies_stay_bit_for_bit_the_same_with_inside_jobs_between_their_steps():
    loaded = tiny(config=LONG, endless=True)
    blocks = list(loaded.model.transformer.h)
    # an Inside job's block takes longer than the core's batch slice (BATCH_SLICE_SECONDS), so the batch steps
    # inside the job whatever the machine's speed (a reply's decode step runs the block in one call, never
    # ln_2's module: it is not slowed); the replies are long enough to still run while the jobs do
    for block in blocks:
        block.ln_2.register_forward_hook(lambda *a: time.sleep(2 * BATCH_SLICE_SECONDS))
    reqs = [dataclasses.replace(r, params=dataclasses.replace(r.params, max_new_tokens=300)) for r in requests(4)]
    prefix = PrefixCache(2**30)
    core = InferenceCore({"chat": loaded}, {"chat": ChatBatch(loaded, 8, prefix), "inside": InsideJobs(loaded, prefix)})
    try:
        # read only at the end: not abandoned as orphans meanwhile, however slow the machine
        replies = [core.submit(Job("chat", f"user{i}", r, orphan_seconds=600)) for i, r in enumerate(reqs)]
        assert wait_for(lambda: all(len(getattr(j.result, "token_ids", [])) >= 2 for j in replies), timeout=30)
        insides, during = [], []
        for n in range(3):
            context = tuple((11 * j + n) % 256 for j in range(300))
            job = core.submit(Job("inside", "viewer", InsideRequest(context, 5, 0)))
            assert wait_for(lambda job=job: job.state == "running", timeout=30)
            before = sum(len(j.result.token_ids) for j in replies)
            drain(job)
            during.append(sum(len(j.result.token_ids) for j in replies) - before)
            insides.append(job)
        for job in replies:
            drain(job)
    finally:
        core.shutdown()
    assert all(j.state == DONE for j in insides + replies)
    assert max(during) > 0  # the replies really stepped while an Inside job ran
    for job, request in zip(replies, reqs):
        assert job.result.token_ids == alone(loaded, request)


