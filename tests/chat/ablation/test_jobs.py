"""Ablated replies and ablation jobs on the shared core: the other replies in the batch stay bit for bit the
same (tokens and odds) with an ablated row beside them and ablation jobs between their steps; the ablated
row is the ablated reply generated alone."""

from __future__ import annotations

import dataclasses

from tests.chat.ablation.test_compute import listening
from tests.chat.decode.test_batched import LONG, alone, drain, requests
from tests.conftest import wait_for
from webapp.chat.ablation.compute import clean_run, parse_parts, zero_edit
from webapp.chat.ablation.jobs import AblationJobs, AblationRequest
from webapp.chat.decode.batched import ChatBatch
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.core import InferenceCore, Job
from webapp.core.jobs import DONE


def run(loaded, reqs, jobs_between: list[AblationRequest]):
    """The replies through a real core (the batched executor and the ablation executor); the ablation jobs
    submitted once every reply has started -> (reply jobs, ablation jobs)."""
    prefix = PrefixCache(2**30)
    core = InferenceCore({"chat": loaded}, {"chat": ChatBatch(loaded, 16, prefix), "ablate": AblationJobs(loaded)})
    try:
        replies = [core.submit(Job("chat", f"user{i}", r)) for i, r in enumerate(reqs)]
        assert wait_for(lambda: all(len(getattr(j.result, "token_ids", [])) >= 2 for j in replies), timeout=30)
        ablations = [core.submit(Job("ablate", "viewer", r)) for r in jobs_between]
        for job in replies + ablations:
            drain(job)
    finally:
        core.shutdown()
    assert all(j.state == DONE for j in replies + ablations)
    return replies, ablations


def test_the_other_replies_stay_bit_for_bit_the_same_beside_ablated_rows_and_ablation_jobs():
    loaded = listening(dataclasses.replace(LONG, n_embd=32))  # a model whose heads matter
    plain = [dataclasses.replace(r, params=dataclasses.replace(r.params, max_new_tokens=40)) for r in requests(4)]
    mean_parts = parse_parts("1.1", None, "0", "mean", 2, 2)
    mean = clean_run(loaded.model, list(plain[1].prompt_ids), mean_parts).mean_edit()
    layer = zero_edit(parse_parts(None, "0", None, "zero", 2, 2), 2)
    ablated = [dataclasses.replace(plain[1], edit=mean), dataclasses.replace(plain[2], edit=layer)]
    positions = [AblationRequest(tuple((11 * j + n) % 256 for j in range(200)), mean_parts, position=True, token=5)
                 for n in range(3)]

    alone_batch, _ = run(loaded, plain, [])
    beside, jobs = run(loaded, plain + ablated, positions)
    for before, after in zip(alone_batch, beside[:len(plain)]):
        assert after.result.token_ids == before.result.token_ids
        assert after.result.odds == before.result.odds  # every probability, bit for bit
    for job, request in zip(beside[len(plain):], ablated):
        assert job.result.token_ids == alone(loaded, request)
        assert job.result.token_ids != alone(loaded, dataclasses.replace(request, edit=None))
    for job in jobs:
        assert job.result.edited is not None and job.result.edited.top != job.result.clean.top
