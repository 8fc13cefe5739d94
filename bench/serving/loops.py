"""Loop lab: per-loop time of the bare model loop vs the observed and streamed loop.

    .venv/bin/python -m bench.serving.loops                 # the bundled model (models/loops), 5 rounds
    .venv/bin/python -m bench.serving.loops --steps 40 --reps 2 --no-doc

Interleaved per round, on the same request (so the same number of loops):
  bare, main thread    model(..., loop_callback=None) in the bench's main thread
  bare, core worker    the same call as a job on the shared core's worker thread, with the worker's
                       own thread count and with GLASSBOX_LOOP_TORCH_THREADS (what Loop-lab jobs use)
  observed             run_trace on the core, its events drained by a subscriber that renders nothing
                       (with the loop attention, which rule each loop read, where the model hands it
                       over; "without attention" asks the same model not to)
  observed + streamed  the real thing: POST /loops/run, run_trace on the core (observation, targets,
                       `rows` events), the SSE stream read by a client thread that renders every
                       fragment, as gunicorn's thread would (Flask test client, no sockets)
Both observed variants run with GLASSBOX_LOOP_TORCH_THREADS threads, as the app runs them.
Per-loop time = the model call's wall time (encoding the prompt included) / loops run.
"""

from __future__ import annotations

import argparse
import re
import string
import tempfile
import time

import torch

from bench import common


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="", help="GLASSBOX_LOOP_MODEL (default: the bundled models/loops)")
    p.add_argument("--steps", type=int, default=200, help="k of the request (1..256)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def request_payload(steps: int) -> dict:
    letters = string.ascii_uppercase
    return {"mapping": [[a, letters[(i + 7) % 26]] for i, a in enumerate(letters)], "start": "A", "steps": steps}


def bare_call(bundle, request) -> tuple[float, int]:
    """-> (seconds, loops) of one native model call without a callback."""
    from webapp.loops.trace import SAFETY_CAP, STOP_THRESHOLD
    started = time.perf_counter()
    encoded = bundle.tokenizer(bundle.render_prompt(list(request.pairs), request.start, request.steps),
                               add_special_tokens=False, return_tensors="pt")
    with torch.inference_mode():
        out = bundle.model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"],
                           num_loops=SAFETY_CAP, completion_threshold=STOP_THRESHOLD,
                           readout_token_ids=list(bundle.readout_token_ids), loop_callback=None)
    return time.perf_counter() - started, out.scores.shape[1]


def bench_jobs():
    """The core runs only the kinds it has an executor for: this one runs a job whose request is
    `fn(job, core)`, whole, on the worker (as the Loop lab's own executor runs a run)."""
    from webapp.core.executors import WholeJobs

    class BenchJobs(WholeJobs):
        def run(self, job, core):
            job.request(job, core)
    return BenchJobs()


def on_core(core, fn):
    """Run fn() as a job on the core's worker; returns its value."""
    from webapp.core import Job
    box = {}
    job = core.submit(Job("bench", "bench", lambda job, core: box.update(value=fn())))
    for _ in job.subscribe(0.5):  # subscribing also keeps the job from being abandoned
        pass
    if job.error:
        raise RuntimeError(job.error)
    return box["value"]


def observed(core, bundle, request, threads: int, attention: bool = True) -> tuple[float, int]:
    """run_trace on the core, its events drained by a subscriber that renders nothing."""
    from webapp.core import Job
    from webapp.core.threads import torch_threads
    from webapp.loops.trace import run_trace
    box = {}

    model = bundle.model
    supports = getattr(model, "supports_loop_attention", None)

    def run(job, core):
        with torch_threads(threads):
            if not attention:
                model.supports_loop_attention = False   # an instance attribute, for this run only
            try:
                box.update(s=run_trace(job, bundle, request))
            finally:
                if not attention:
                    del model.supports_loop_attention
                    assert getattr(model, "supports_loop_attention", None) == supports
    job = core.submit(Job("bench", "bench", run))
    for _ in job.subscribe(0.5):
        pass
    return box["s"]["inference_seconds"], box["s"]["summary"]["executed_loops"]


def streamed(app, core, steps: int) -> tuple[float, int]:
    """One run through the app's own routes, the stream read to its end."""
    client = app.test_client()
    page = client.get("/loops/").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    payload = request_payload(steps)
    form = {"csrf_token": csrf, "src": [a for a, _ in payload["mapping"]], "dst": [b for _, b in payload["mapping"]],
            "start": payload["start"], "steps": str(steps)}
    live = client.post("/loops/run", data=form, headers={"HX-Request": "true"}).get_data(as_text=True)
    url = re.search(r'sse-connect="([^"]+)"', live).group(1)
    job_id = re.search(r"/loops/jobs/([^/]+)/stream", url).group(1)
    response = client.get(url)
    text = b"".join(chunk for chunk in response.response).decode()  # reads as it arrives
    rows = sum(f.count("<tr") for f in text.split("\n\n") if f.startswith("event: rows"))
    snapshot = core.get(job_id).result.snapshot
    assert rows == snapshot["summary"]["executed_loops"], (rows, snapshot["summary"])
    return snapshot["inference_seconds"], rows


def main(argv=None):
    args = parse_args(argv)
    from webapp import create_app
    from webapp.config import Settings
    from webapp.core.threads import torch_threads
    from webapp.loops.model.checkpoint import load_bundle
    from webapp.loops.request import DemoRequest
    from webapp.web.state import glassbox
    load_before = common.load_average()
    bundle = load_bundle(args.model or None)
    request = DemoRequest.parse(request_payload(args.steps))
    settings = Settings.from_env()
    settings = Settings(instance_path=tempfile.mkdtemp(prefix="glassbox-loops-"), secret_key="bench",
                        max_jobs_per_owner=100, loop_torch_threads=settings.loop_torch_threads,
                        torch_threads=settings.torch_threads)
    app = create_app(settings, models={"loops": bundle}, test_config={"TESTING": True})
    core = glassbox(app).core
    core.ready.wait(60)
    core.executors["bench"] = bench_jobs()
    threads = settings.loop_torch_threads

    def bare_on_worker(count):
        def call():
            with torch_threads(count):
                return bare_call(bundle, request)
        return lambda: on_core(core, call)
    worker_threads = on_core(core, torch.get_num_threads)
    base = f"bare, core worker, {threads or worker_threads} thread(s)"
    variants = {"bare, main thread": lambda: bare_call(bundle, request),
                f"bare, core worker, {worker_threads} thread(s)": bare_on_worker(0),
                base: bare_on_worker(threads),  # the same key when the two counts agree: measured once
                "observed, events drained unrendered": lambda: observed(core, bundle, request, threads),
                "observed, without attention": lambda: observed(core, bundle, request, threads, attention=False),
                "observed + streamed (run_trace on the core)": lambda: streamed(app, core, args.steps)}
    per_loop = {k: [] for k in variants}
    loops = {}
    try:
        for r in range(args.reps + 1):  # round 0 warms up
            for name, fn in variants.items():
                seconds, n = fn()
                loops.setdefault(name, n)
                if r:
                    per_loop[name].append(seconds / n)
            print(f"  round {r}: " + ", ".join(f"{k} {v[-1] * 1e6:.0f} µs" for k, v in per_loop.items() if v),
                  flush=True)
    finally:
        core.shutdown()
    assert len(set(loops.values())) == 1, loops
    base_main = common.median(per_loop["bare, main thread"])
    base_core = common.median(per_loop[base])
    rows = [[k, loops[k], common.median(v) * 1e6, common.median(v) / base_main, common.median(v) / base_core]
            for k, v in per_loop.items()]
    body = (common.table(["variant", "loops per run", "µs per loop (median)", "÷ bare main thread",
                          f"÷ {base}"], rows)
            + f"\n\n- model: {bundle.checkpoint_id} ({bundle.model.num_params() / 1e3:.0f}k parameters); request: "
            + f"a 26-letter cycle, start A, k = {args.steps}; {args.reps} rounds, interleaved, after one warm-up.\n")
    common.report("Loop lab: bare loop vs observed and streamed loop", body, load_before=load_before,
                  write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
