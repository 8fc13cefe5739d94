"""Attribution jobs on the shared core: running replies stay bit for bit the same with attribution jobs
between their steps, and the replies really step while one runs."""

from __future__ import annotations

import dataclasses
import time

from tests.chat.decode.test_batched import LONG, alone, drain, requests
from tests.chat.decode.test_generate import tiny
from tests.conftest import wait_for
from webapp.chat.attribution.jobs import AttributionJobs, AttributionRequest
from webapp.chat.decode.batched import ChatBatch
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.core import InferenceCore, Job
from webapp.core.jobs import DONE
from webapp.core.sharing import BATCH_SLICE_SECONDS


def test_running_replies_stay_bit_for_bit_the_same_with_attribution_jobs_between_their_steps():
    loaded = tiny(config=LONG, endless=True)
    # each block of an attribution job takes longer than the core's batch slice, so the batch steps inside the
    # job whatever the machine's speed (a reply's decode step runs the block in one call, never ln_2's module)
    for block in loaded.model.transformer.h:
        block.ln_2.register_forward_hook(lambda *a: time.sleep(2 * BATCH_SLICE_SECONDS))
    reqs = [dataclasses.replace(r, params=dataclasses.replace(r.params, max_new_tokens=200)) for r in requests(4)]
    prefix = PrefixCache(2**30)
    core = InferenceCore({"chat": loaded}, {"chat": ChatBatch(loaded, 8, prefix),
                                            "attribution": AttributionJobs(loaded, prefix)})
    try:
        # read only at the end: not abandoned as orphans meanwhile, however slow the machine
        replies = [core.submit(Job("chat", f"user{i}", r, orphan_seconds=600)) for i, r in enumerate(reqs)]
        assert wait_for(lambda: all(len(getattr(j.result, "token_ids", [])) >= 2 for j in replies), timeout=30)
        jobs, during = [], []
        for n in range(2):
            context = tuple((13 * j + n) % 256 for j in range(300))
            job = core.submit(Job("attribution", "viewer", AttributionRequest(context, 5, 0, 7 if n else None)))
            assert wait_for(lambda job=job: job.state == "running", timeout=30)
            before = sum(len(j.result.token_ids) for j in replies)
            drain(job)
            during.append(sum(len(j.result.token_ids) for j in replies) - before)
            jobs.append(job)
        for job in replies:
            drain(job)
    finally:
        core.shutdown()
    assert [(j.state, j.error) for j in jobs + replies] == [(DONE, None)] * 6
    assert all(abs(j.result.report.attribution.total() - j.result.report.attribution.logit) < 1e-3 for j in jobs)
    assert max(during) > 0  # the replies really stepped while an attribution job ran
    for job, request in zip(replies, reqs):
        assert job.result.token_ids == alone(loaded, request)
