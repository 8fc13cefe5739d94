"""Loop lab: a sweep as the page starts it, against its runs one at a time, and a chat reply meanwhile.

    .venv/bin/python -m bench.serving.loops_sweep                     # 8 k × 25 tables, the bundled models
    .venv/bin/python -m bench.serving.loops_sweep --tables 10 --no-doc

Through the app (create_app, the bundled chat and loop models, a throwaway instance folder), in one run:
  one at a time    each of the sweep's runs POSTed to /api/loops/trace once the one before it ended
  sweep, 3 wide    POST /api/loops/sweep with the sweep's runs three in flight (how sweeps ran before they
                   counted as one job: one fewer than a browser's job limit)
  sweep            POST /api/loops/sweep as the app runs it now (webapp/loops/boot.py sweeps)
Wall time from the POST to the last line; every run's summary must agree between the three (checked, with
"runs": true). Then a chat reply's first token on the same core, idle and while the sweep runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time

from bench import common
from bench.serving.loops_batch import first_token

KS = [1, 2, 4, 8, 16, 32, 64, 128]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", type=int, default=25, help="tables per k (8 k values)")
    p.add_argument("--model", default="main", help="which Loop-lab model (main, latent, …)")
    p.add_argument("--replies", type=int, default=8, help="chat replies timed, idle and during the sweep")
    p.add_argument("--no-doc", action="store_true")
    return p.parse_args(argv)


def sweep(client, body: dict) -> tuple[float, list[dict]]:
    started = time.perf_counter()
    lines = [json.loads(x) for x in client.post("/api/loops/sweep", json=body).get_data(as_text=True).splitlines()
             if x.strip()]
    seconds = time.perf_counter() - started
    if lines[-1].get("status") != "complete":
        raise RuntimeError(lines[-1])
    return seconds, [run for line in lines[:-1] for run in line["runs"]]


def one_at_a_time(client, model: str, runs: list[dict]) -> tuple[float, list[dict]]:
    started, summaries = time.perf_counter(), []
    for run in runs:
        lines = client.post(f"/api/loops/trace?model={model}", json=run["request"]).get_data(as_text=True)
        summaries.append(json.loads(lines.strip().splitlines()[-1])["summary"])
    return time.perf_counter() - started, summaries


def main(argv=None) -> None:
    args = parse_args(argv)
    load_before = common.load_average()
    from webapp import create_app
    from webapp.config import Settings
    from webapp.loops.sweeping import Sweeps
    from webapp.web.state import glassbox

    body = {"model": args.model, "family": "function", "k": KS, "tables": args.tables, "seed": 1, "runs": True}
    with tempfile.TemporaryDirectory() as folder:
        settings = Settings(instance_path=folder, secret_key="bench-secret-key-0123", sweep_max_runs=100_000)
        app = create_app(settings)
        core = glassbox(app).core
        core.ready.wait(600)
        sweeps = glassbox(app).service(Sweeps)
        width = sweeps.in_flight
        try:
            client = app.test_client()
            now_s, runs = sweep(client, body)
            sweeps.in_flight = 3
            narrow_s, narrow = sweep(client, body)
            sweeps.in_flight = width
            alone_s, alone = one_at_a_time(client, args.model, runs)
            for a, b, c in zip(runs, narrow, alone):
                assert a["summary"] == b["summary"] == c, (a["request"], a["summary"], c)
            loops = sum(run["summary"]["executed_loops"] for run in runs)
            idle = first_token(core, "chat", args.replies, 0)
            busy: list[float] = []
            during = threading.Thread(target=lambda: sweep(app.test_client(), {**body, "seed": 2}))
            rows = core.counters["rows"]
            during.start()
            while core.counters["rows"] == rows:  # until the sweep's runs are stepping
                time.sleep(0.01)
            busy = first_token(core, "chat", args.replies, 0)
            during.join()
        finally:
            core.shutdown()
    n = len(runs)
    rows = [["one at a time (/api/loops/trace)", n, loops, alone_s, n / alone_s, 1.0],
            ["sweep, 3 runs in flight (before)", n, loops, narrow_s, n / narrow_s, alone_s / narrow_s],
            [f"sweep, {width} runs in flight (now)", n, loops, now_s, n / now_s, alone_s / now_s]]
    text = common.table(["how", "runs", "loops", "seconds", "runs/s", "speed-up"], rows)
    idle_ms, busy_ms = 1000 * statistics.median(idle), 1000 * statistics.median(busy)
    text += "\n\n" + common.table(["chat first token", "replies", "median ms", "max ms", "vs idle"],
                                  [["idle", len(idle), idle_ms, 1000 * max(idle), 1.0],
                                   ["during a sweep", len(busy), busy_ms, 1000 * max(busy), busy_ms / idle_ms]])
    text += (f"\n\n- model {args.model}; random functions, k = {KS}, {args.tables} tables per k, seed 1; "
             "every run's summary the same three ways")
    common.report(f"Loop lab, a sweep from the page ({args.model})", text, load_before=load_before,
                  write_doc=not args.no_doc)


if __name__ == "__main__":
    main()
