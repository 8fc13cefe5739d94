"""Loop lab: many runs stepped together on the core against the same runs one at a time.

    .venv/bin/python -m bench.serving.loops_batch                      # 1,000 runs, the bundled model
    .venv/bin/python -m bench.serving.loops_batch --runs 200 --no-doc

In one process, side by side, on the core with the app's executors (webapp/loops/runs.py, batch.py):
  one at a time   each run submitted once the one before it ended, run whole (the model's forward with
                  the trace's observer: the path every run took before runs were batched)
  batched         all the runs submitted at once, stepping together (LoopBatch): one forward per loop
                  carrying every running table, each stopping on its own head
The runs are seeded random-function tables, k uniform in 1..256 (as a sweep's). Throughput = runs (and
loops) per second of wall time from the first submission to the last run's end; every run's summary
must be the same both ways (it is checked). Then a chat reply's first token on the same core (the
bundled chat model, batched as the app runs it): idle, and while a sweep-sized batch of runs steps.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from bench import common


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=1000, help="runs each way (k uniform in 1..256)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replies", type=int, default=10, help="chat replies timed, idle and during the sweep")
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def requests(n: int, seed: int):
    from webapp.loops.request import DemoRequest
    from webapp.loops.task import SYMBOLS
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        sources = list(SYMBOLS)
        rng.shuffle(sources)
        mapping = [[s, rng.choice(SYMBOLS)] for s in sources]
        out.append(DemoRequest.parse({"mapping": mapping, "start": rng.choice(SYMBOLS),
                                      "steps": rng.randint(1, 256)}))
    return out


def submit(core, kind: str, request):
    from webapp.core import Job
    from webapp.loops.runs import LoopResult
    # nobody subscribes while it waits: it must not be taken for abandoned
    return core.submit(Job(kind, "bench", request, result=LoopResult(), orphan_seconds=1e9))


def wait(job) -> None:
    for _ in job.subscribe(1.0):
        pass
    if job.error:
        raise RuntimeError(job.error)


def one_at_a_time(core, reqs) -> tuple[float, list]:
    started, jobs = time.perf_counter(), []
    for req in reqs:
        jobs.append(submit(core, "loops", req))
        wait(jobs[-1])
    return time.perf_counter() - started, jobs


def batched(core, reqs) -> tuple[float, list]:
    from webapp.loops.runs import BATCHED
    started = time.perf_counter()
    jobs = [submit(core, BATCHED, req) for req in reqs]
    for job in jobs:
        wait(job)
    return time.perf_counter() - started, jobs


def first_token(core, kind: str, n: int, seed: int) -> list[float]:
    """Seconds from submission to the first token of n chat replies, one after another."""
    from webapp.chat.decode.types import ChatRequest, SamplingParams
    from webapp.core import Job
    times = []
    for i in range(n):
        prompt = tuple((7 * j + 13 * i + seed) % 200 + 10 for j in range(40))
        job = core.submit(Job(kind, f"chat{i}", ChatRequest(prompt, SamplingParams(max_new_tokens=4, seed=i))))
        started = time.perf_counter()
        for event in job.subscribe(0.5):
            if event is not None and event.name == "token":
                times.append(time.perf_counter() - started)
                break
        job.cancel()
        wait(job)
    return times


def main(argv=None) -> None:
    args = parse_args(argv)
    load_before = common.load_average()
    from webapp.chat.decode.batched import ChatBatch
    from webapp.chat.decode.prefix_cache import PrefixCache
    from webapp.chat.model.loading import load_chat_model
    from webapp.core import InferenceCore
    from webapp.loops.batch import LoopBatch
    from webapp.loops.model.checkpoint import load_bundle
    from webapp.loops.runs import BATCHED, LoopRuns

    bundle = load_bundle()
    runs = LoopRuns(bundle)
    chat = load_chat_model(str(common.ROOT / "models" / "chat" / "model.safetensors"))
    core = InferenceCore({"loops": bundle, "chat": chat},
                         {"loops": runs, BATCHED: LoopBatch(runs), "chat": ChatBatch(chat, 16, PrefixCache(0))},
                         max_queue=args.runs + 64)
    try:
        reqs = requests(args.runs, args.seed)
        alone_s, alone = one_at_a_time(core, reqs)
        batch_s, together = batched(core, reqs)
        for a, b in zip(alone, together):
            assert a.result.snapshot["summary"] == b.result.snapshot["summary"], (a.request, b.request)
        loops = sum(j.result.snapshot["summary"]["executed_loops"] for j in together)
        idle = first_token(core, "chat", args.replies, args.seed)
        sweep = [submit(core, BATCHED, req) for req in reqs]
        busy = first_token(core, "chat", args.replies, args.seed)
        still_running = sum(not j.finished_state for j in sweep)
        for job in sweep:
            wait(job)
    finally:
        core.shutdown()
    rows = [["one at a time", args.runs, loops, alone_s, args.runs / alone_s, loops / alone_s, 1.0],
            ["batched", args.runs, loops, batch_s, args.runs / batch_s, loops / batch_s, alone_s / batch_s]]
    body = common.table(["runs", "n", "loops", "seconds", "runs/s", "loops/s", "speed-up"], rows)
    idle_ms, busy_ms = 1000 * statistics.median(idle), 1000 * statistics.median(busy)
    body += ("\n\n" + common.table(
        ["chat first token", "replies", "median ms", "max ms", "vs idle"],
        [["idle", len(idle), idle_ms, 1000 * max(idle), 1.0],
         [f"during a sweep of {args.runs} runs", len(busy), busy_ms, 1000 * max(busy), busy_ms / idle_ms]]))
    body += (f"\n\n- every run's summary the same both ways; k uniform in 1..256, seed {args.seed}; "
             f"{still_running} of the sweep's runs were still running after the last timed reply")
    common.report("Loop lab: runs batched against one at a time", body, load_before=load_before,
                  write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
