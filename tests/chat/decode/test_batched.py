"""The batched decoder: replies stepped together are the replies generated alone, token for token."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

import pytest
import torch

from tests.chat.decode.test_generate import TINY, tiny
from tests.conftest import wait_for
from tests.support.executors import FunctionJobs
from webapp.chat.decode.alone import ChatAlone
from webapp.chat.decode.batched import ChatBatch
from webapp.chat.decode.generate import Sequence, generate, prefill_chunk
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.decode.types import ChatRequest, SamplingParams
from webapp.chat.model import kernels
from webapp.chat.model.edits import Edit, HeadEdit, MlpEdit
from webapp.chat.model.gpt import Chunk
from webapp.chat.model.loading import load_chat_model
from webapp.chat.model.precision import apply_precision
from webapp.core import InferenceCore, Job
from webapp.core.jobs import CANCELLED, DONE
from webapp.core.scheduler import Newcomer, prefill_pass

BUNDLED = Path(__file__).resolve().parents[3] / "models/chat/model.safetensors"
LONG = dataclasses.replace(TINY, block_size=512)


def requests(n: int, vocab: int = 256):
    """n replies unlike each other: prompts of several lengths (some several prefill chunks long),
    greedy and seeded sampling at several temperatures and top-k, several lengths."""
    out = []
    for i in range(n):
        prompt = tuple((7 * j + 13 * i) % vocab for j in range(3 + 37 * i))
        params = SamplingParams(max_new_tokens=8 + 5 * (i % 4), temperature=[0.0, 1.0, 0.7, 1.3][i % 4],
                                top_k=[0, 50, 5, 0][i % 4], seed=100 + i)
        out.append(ChatRequest(prompt, params))
    return out


def alone(loaded, request: ChatRequest) -> list[int]:
    p = request.params
    pieces = generate(loaded, request.prompt_ids, max_new_tokens=p.max_new_tokens, temperature=p.temperature,
                      top_k=p.top_k, seed=p.seed, edit=request.edit)
    return [piece.token for piece in pieces if piece.token is not None]


def drain(job):
    return [e for e in job.subscribe(0.05) if e is not None]


def batched(loaded, reqs, max_rows=16, cancel=None):
    """Run the requests through a real core with the batched executor; -> (jobs, batch sizes seen)."""
    sizes, original = [], loaded.model.decode_step
    loaded.model.decode_step = lambda idx, *a: sizes.append(idx.size(0)) or original(idx, *a)
    core = InferenceCore({"chat": loaded}, {"chat": ChatBatch(loaded, max_rows, PrefixCache(2**30))})
    try:
        jobs = [Job("chat", f"user{i}", r) for i, r in enumerate(reqs)]
        for job in jobs:
            core.submit(job)
        if cancel is not None:
            assert wait_for(lambda: len(getattr(jobs[cancel].result, "token_ids", [])) >= 3)
            jobs[cancel].cancel()
        for job in jobs:
            drain(job)
    finally:
        core.shutdown()
        del loaded.model.decode_step
    return jobs, sizes


def test_a_batched_reply_is_the_reply_generated_alone():
    loaded = tiny(config=LONG, endless=True)
    reqs = requests(8)
    jobs, sizes = batched(loaded, reqs)
    assert max(sizes) >= 4  # they really were stepped together
    assert all(job.state == DONE for job in jobs)
    for job, request in zip(jobs, reqs):
        assert job.result.token_ids == alone(loaded, request)
        assert len(job.result.token_ids) == request.params.max_new_tokens


def test_an_edited_reply_in_a_batch_is_the_edited_reply_alone_and_the_others_are_their_own():
    loaded = tiny(config=LONG, endless=True)
    reqs = requests(4)
    reqs[2] = dataclasses.replace(reqs[2], edit=Edit(heads=(HeadEdit(layer=0, head=1),), mlps=(MlpEdit(1),)))
    jobs, sizes = batched(loaded, reqs)
    assert max(sizes) >= 3
    assert all(job.state == DONE for job in jobs)
    for job, request in zip(jobs, reqs):
        assert job.result.token_ids == alone(loaded, request)


@pytest.mark.skipif(not BUNDLED.is_file(), reason="bundled model not trained yet")
def test_the_bundled_model_replies_the_same_in_a_batch():
    loaded = load_chat_model(str(BUNDLED))
    questions = ["What is the capital of Japan?", "What is 12 plus 30?", "Hello!", "What is the Loop lab?",
                 "What is the chemical symbol for gold?", "What is 86 minus 7?"]
    reqs = [ChatRequest(tuple(loaded.prompt.build([{"role": "user", "content": q}], 40)),
                        SamplingParams(40, temperature=[0.0, 0.9][i % 2], top_k=[0, 20][i % 2], seed=i))
            for i, q in enumerate(questions)]
    jobs, sizes = batched(loaded, reqs)
    assert max(sizes) >= 3
    assert [job.result.token_ids for job in jobs] == [alone(loaded, r) for r in reqs]
    assert "".join(jobs[0].result.text) == "The capital of Japan is Tokyo."


@torch.inference_mode()
@pytest.mark.parametrize("kernel", ["glassbox", "torch"])
@pytest.mark.parametrize("precision", ["float32", "bfloat16", "int8"])
def test_a_rows_logits_do_not_depend_on_the_other_rows(precision, kernel):
    """The property the equality rests on, bit for bit: whatever the batch, a row's logits are the same,
    at every precision the CPU runs, with Glassbox's decode kernel and with torch's (its fallback)."""
    assert kernels.library() is not None, kernels.unavailable_reason  # CI has a C compiler: the kernel is tested
    with contextlib.nullcontext() if kernel == "glassbox" else kernels.disabled():
        rows_alone_and_together(apply_precision(tiny(config=LONG).model, precision))


def rows_alone_and_together(model):
    prompts = [[(3 * j + i) % 256 for j in range(5 + 11 * i)] for i in range(6)]
    caches, last = [], []
    for prompt in prompts:
        cache = model.new_cache(1, 512)
        model.prefill([Chunk(prompt[:-1], cache, 0, logits=False)])
        caches.append(cache)
        last.append(prompt[-1])
    positions = [len(p) - 1 for p in prompts]
    idx = torch.tensor(last).view(-1, 1)
    together = model.decode_step(idx, caches, positions)
    for r in range(len(prompts)):
        assert torch.equal(model.decode_step(idx[r:r + 1], [caches[r]], [positions[r]]), together[r:r + 1])
        assert torch.equal(model.decode_step(idx[r:r + 3], caches[r:r + 3], positions[r:r + 3])[0], together[r])


def test_cancelling_one_row_leaves_the_others_untouched():
    loaded = tiny(config=LONG, endless=True)
    reqs = [dataclasses.replace(r, params=dataclasses.replace(r.params, max_new_tokens=60)) for r in requests(4)]
    jobs, _ = batched(loaded, reqs, cancel=1)
    assert jobs[1].state == CANCELLED and 3 <= len(jobs[1].result.token_ids) < 60
    assert jobs[1].result.token_ids == alone(loaded, reqs[1])[:len(jobs[1].result.token_ids)]
    for i in (0, 2, 3):
        assert jobs[i].state == DONE and jobs[i].result.token_ids == alone(loaded, reqs[i])


def test_more_replies_than_rows_wait_for_a_free_row_and_keep_their_place():
    loaded = tiny(config=LONG, endless=True)
    reqs = requests(5)
    jobs, sizes = batched(loaded, reqs, max_rows=2)
    assert max(sizes) == 2
    assert [job.result.token_ids for job in jobs] == [alone(loaded, r) for r in reqs]
    assert [job.started for job in jobs] == sorted(job.started for job in jobs)  # first come, first served


def test_a_newcomers_prefill_is_chunked_between_the_others_steps(monkeypatch):
    loaded = tiny(config=LONG, endless=True)
    monkeypatch.setattr("webapp.chat.decode.generate.PREFILL_FLOPS", 0.0)  # the smallest chunks
    chunk = prefill_chunk(loaded.model)
    core = InferenceCore({"chat": loaded}, {"chat": ChatBatch(loaded, 4, PrefixCache(2**30))})
    order, original = [], loaded.model.prefill
    loaded.model.prefill = lambda chunks: order.extend(("prefill", len(c.ids)) for c in chunks) or original(chunks)
    step = loaded.model.decode_step
    loaded.model.decode_step = lambda idx, *a: order.append(("decode", idx.size(0))) or step(idx, *a)
    try:
        first = core.submit(Job("chat", "a", ChatRequest((1, 2, 3), SamplingParams(200, 0.0, 0))))
        assert wait_for(lambda: len(getattr(first.result, "token_ids", [])) >= 2)
        newcomer = core.submit(Job("chat", "b", ChatRequest(tuple(range(5 * chunk)), SamplingParams(5, 0.0, 0))))
        drain(newcomer)
        first.cancel()
        drain(first)
    finally:
        core.shutdown()
    chunks = [i for i, (what, n) in enumerate(order) if what == "prefill" and n > 3]
    assert len(chunks) == 5 and all(order[i][1] == chunk for i in chunks)
    for a, b in zip(chunks, chunks[1:]):  # the running reply decoded between every two chunks
        assert ("decode", 1) in order[a + 1:b]


def test_a_loop_lab_run_does_not_wait_for_a_whole_reply():
    loaded = tiny(config=LONG, endless=True)
    loaded.model.lm_head.register_forward_hook(lambda m, a, out: time.sleep(0.01))
    core = InferenceCore({"chat": loaded}, {"chat": ChatBatch(loaded, 4, PrefixCache(2**30)), "loops": FunctionJobs()})
    try:
        reply = core.submit(Job("chat", "a", ChatRequest((1, 2, 3), SamplingParams(150, 0.0, 0))))
        assert wait_for(lambda: len(getattr(reply.result, "token_ids", [])) >= 2)
        run = core.submit(Job("loops", "b", lambda job, c: job.keep("rows", n=len(reply.result.token_ids))))
        drain(run)
        assert run.state == DONE and reply.state == "running"  # ran between two decoding steps
        tokens_then = run.events[0].data["n"]
        assert tokens_then < 150
        drain(reply)
        assert reply.state == DONE and len(reply.result.token_ids) == 150
    finally:
        core.shutdown()


def test_positions_count_the_jobs_a_job_really_waits_behind():
    loaded = tiny(config=LONG, endless=True)
    loaded.model.lm_head.register_forward_hook(lambda m, a, out: time.sleep(0.005))
    core = InferenceCore({"chat": loaded}, {"chat": ChatBatch(loaded, 1, PrefixCache(2**30)), "loops": FunctionJobs()})
    try:
        running = core.submit(Job("chat", "a", ChatRequest((1, 2), SamplingParams(400, 0.0, 0))))
        assert wait_for(lambda: running.state == "running")
        second = core.submit(Job("chat", "b", ChatRequest((1, 2), SamplingParams(5, 0.0, 0))))
        third = core.submit(Job("chat", "c", ChatRequest((1, 2), SamplingParams(5, 0.0, 0))))
        assert (second.position, third.position) == (1, 2)  # waiting for the one row
        run = core.submit(Job("loops", "d", lambda job, c: None))
        drain(run)  # not behind the chat replies: it ran between two steps
        assert run.state == DONE and third.position == 2
        running.cancel()
        for job in (running, second, third):
            drain(job)
    finally:
        core.shutdown()


def test_a_model_without_a_kv_cache_replies_one_at_a_time():
    loaded = tiny(kv=False, config=LONG)
    core = InferenceCore({"chat": loaded}, {"chat": ChatAlone(loaded)})
    reqs = requests(3)
    try:
        jobs = [core.submit(Job("chat", f"u{i}", r)) for i, r in enumerate(reqs)]
        assert wait_for(lambda: jobs[0].state == "running")
        assert jobs[1].position == 1 and jobs[2].position == 2
        for job in jobs:
            drain(job)
    finally:
        core.shutdown()
    assert [job.result.token_ids for job in jobs] == [alone(loaded, r) for r in reqs]
    assert jobs[0].finished <= jobs[1].started and jobs[1].finished <= jobs[2].started


def test_kept_caches_are_the_least_recently_used_within_the_budget():
    model = tiny().model
    one = model.new_cache(1, 32).nbytes
    holder = PrefixCache(budget_bytes=2 * one + one // 2)
    for conversation in range(3):
        holder.put(model.new_cache(1, 32), [conversation, 1, 2, 3], model)
    assert len(holder) == 2 and holder.evictions == 1 and holder.nbytes == 2 * one
    p = next(model.parameters())
    assert holder.take([0, 1, 2, 3, 9], p.device, p.dtype, model) is None  # the oldest was evicted
    taken = holder.take([2, 1, 2, 9], p.device, p.dtype, model)
    assert taken.ids == [2, 1, 2, 3] and len(holder) == 1  # the longest shared prefix, now the caller's
    assert holder.take([7, 7], p.device, p.dtype, model) is None  # nothing shared: no entry is spent on it


def test_running_replies_keep_stepping_during_a_long_loop_lab_run():
    """A Loop-lab run that takes a while hands the worker to the batch between its loops
    (InferenceCore.interleave): a running reply keeps getting tokens, and stays the reply alone."""
    from tests.support.loop_models import bundle
    from webapp.loops.request import DemoRequest
    from webapp.loops.runs import LoopRuns
    loaded = tiny(config=LONG, endless=True)
    runs = bundle(delay=0.02)  # 20 ms a loop: a 100-loop run holds the worker 2 s
    core = InferenceCore({"chat": loaded, "loops": runs},
                         {"chat": ChatBatch(loaded, 4, PrefixCache(2**30)), "loops": LoopRuns(runs)})
    try:
        request = ChatRequest((1, 2, 3), SamplingParams(400, 0.0, 0))
        reply = core.submit(Job("chat", "a", request))
        assert wait_for(lambda: len(getattr(reply.result, "token_ids", [])) >= 2)
        run = core.submit(Job("loops", "b", DemoRequest.parse(
            {"mapping": [[c, c] for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"], "start": "A", "steps": 100})))
        assert wait_for(lambda: run.state == "running")
        during = len(reply.result.token_ids)
        assert wait_for(lambda: len(reply.result.token_ids) >= during + 10, timeout=1.5)
        assert run.state == "running"  # the reply moved on while the run was still running
        drain(run)
        reply.cancel()
        drain(reply)
    finally:
        core.shutdown()
    tokens = reply.result.token_ids
    assert tokens == alone(loaded, dataclasses.replace(request, params=dataclasses.replace(
        request.params, max_new_tokens=len(tokens))))


def test_newcomers_arriving_together_prefill_in_one_step_while_the_running_reply_decodes():
    """A crowd of short prompts is prefilled in one step (one chunk's worth of tokens), not one a step:
    by the first decoding step after any newcomer's prefill, every newcomer has its first token; the
    running reply got a token in that step too; every reply is the reply alone."""
    loaded = tiny(config=LONG, endless=True)
    core = InferenceCore({"chat": loaded}, {"chat": ChatBatch(loaded, 8, PrefixCache(2**30))})
    newcomers: list[Job] = []
    seen, step = [], loaded.model.decode_step

    def slow_step(idx, *a):  # a slow step, so the newcomers all arrive during one
        seen.append((idx.size(0), sum(1 for j in newcomers if getattr(j.result, "token_ids", None))))
        time.sleep(0.05)
        return step(idx, *a)

    loaded.model.decode_step = slow_step
    reqs = requests(5)[1:]
    try:
        first = core.submit(Job("chat", "a", ChatRequest((1, 2, 3), SamplingParams(200, 0.0, 0))))
        assert wait_for(lambda: len(getattr(first.result, "token_ids", [])) >= 2)
        newcomers.extend(Job("chat", f"user{i}", r) for i, r in enumerate(reqs))
        for job in newcomers:
            core.submit(job)
        for job in newcomers:
            drain(job)
        first.cancel()
        drain(first)
    finally:
        core.shutdown()
        del loaded.model.decode_step
    after = next(i for i, (_, started) in enumerate(seen) if started)
    assert seen[after] == (1 + len(reqs), len(reqs))  # all prefilled at once; the running row decodes too
    assert [job.result.token_ids for job in newcomers] == [alone(loaded, r) for r in reqs]


def test_a_step_prefills_newcomers_within_one_chunks_worth_of_tokens(monkeypatch):
    """While replies decode, the oldest newcomer always runs its chunk and the next ones only while the
    step's prefill stays within one chunk of tokens (a shorter one behind a long one still fits); with none
    decoding, all of them; each is cut exactly as alone."""
    loaded = tiny(config=LONG, endless=True)
    monkeypatch.setattr("webapp.chat.decode.generate.PREFILL_FLOPS", 0.0)  # the smallest chunks
    chunk = prefill_chunk(loaded.model)
    params = SamplingParams(4, 0.0, 0)
    lengths = [3 * chunk, chunk // 2, chunk, chunk // 4, chunk // 4]
    rows = [(Job("chat", f"u{i}"), Sequence(loaded, tuple(range(1, n + 1)), params))
            for i, n in enumerate(lengths)]

    def newcomers_this_step(rows, others_decoding):  # the scheduler's plan, on the rows as plain data
        seqs = {job.id: seq for job, seq in rows}
        planned = prefill_pass([Newcomer(job.id, len(seq.todo), seq.chunk) for job, seq in rows], others_decoding)
        assert planned.tokens == sum(len(seqs[row].next_chunk) for row in planned.rows)
        return [(row, seqs[row]) for row in planned.rows]

    assert [len(seq.next_chunk) for _, seq in newcomers_this_step(rows, True)] == [chunk]  # the oldest fills it
    rows[0][1].todo = rows[0][1].todo[:chunk // 4]  # now it needs a quarter of a chunk
    chosen = [len(seq.next_chunk) for _, seq in newcomers_this_step(rows, True)]
    assert chosen == [chunk // 4, chunk // 2, chunk // 4]  # the whole chunk after them waits
    # with no reply decoding there is nobody to stall: every newcomer runs its next chunk
    assert [len(seq.next_chunk) for _, seq in newcomers_this_step(rows, False)] == [chunk // 4, chunk // 2, chunk,
                                                                                     chunk // 4, chunk // 4]


def test_a_reply_arriving_during_a_prefill_pass_is_prefilled_before_that_steps_decoding_pass():
    """Its first token waits for the pass under way, not for a whole step: it is admitted when the pass
    ends and prefilled before the decoding pass (within the step's one chunk of prefill tokens)."""
    loaded = tiny(config=LONG, endless=True)
    core = InferenceCore({"chat": loaded}, {"chat": ChatBatch(loaded, 8, PrefixCache(2**30))})
    first = Job("chat", "a", ChatRequest((1, 2, 3), SamplingParams(200, 0.0, 0)))
    early = Job("chat", "b", ChatRequest((4, 5, 6, 7), SamplingParams(6, 0.0, 0)))
    late = Job("chat", "c", ChatRequest((8, 9, 10, 11, 12), SamplingParams(6, 0.0, 0)))
    order, prefill, step = [], loaded.model.prefill, loaded.model.decode_step

    def prefilling(chunks):
        order.extend(("prefill", chunk.ids[0]) for chunk in chunks)
        if chunks[0].ids[0] == 4:  # the early newcomer's pass: the late one arrives meanwhile
            core.submit(late)
        return prefill(chunks)

    def decoding(idx, *a):
        order.append(("decode", idx.size(0)))
        return step(idx, *a)

    try:
        core.submit(first)
        assert wait_for(lambda: len(getattr(first.result, "token_ids", [])) >= 2)
        loaded.model.prefill, loaded.model.decode_step = prefilling, decoding
        core.submit(early)
        drain(early)
        drain(late)
        first.cancel()
        drain(first)
    finally:
        core.shutdown()
        del loaded.model.prefill, loaded.model.decode_step
    at = order.index(("prefill", 4))
    assert order[at + 1:at + 3] == [("prefill", 8), ("decode", 3)]  # no decoding pass between the two
    for job in (early, late):
        assert job.result.token_ids == alone(loaded, job.request)
