"""What the core reports about itself: Prometheus text for /metrics and one log line per job.

Neither ever contains a message's text: jobs are described by id, kind, outcome, timings and counts.
"""

from __future__ import annotations

import logging
import threading
import time

from webapp.core.executors import StepReport
from webapp.core.jobs import AnyJob

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
JOB_BUCKETS = (0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
OUTCOMES = ("submitted", "done", "cancelled", "failed")

job_log = logging.getLogger("glassbox.jobs")


class LatencyHistogram:
    def __init__(self, buckets: tuple[float, ...] = BUCKETS) -> None:
        self.buckets = buckets
        self._lock = threading.Lock()
        self._counts = [0] * (len(buckets) + 1)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        with self._lock:
            self._sum += seconds
            for i, bound in enumerate(self.buckets):
                if seconds <= bound:
                    self._counts[i] += 1
                    return
            self._counts[-1] += 1

    def lines(self, name: str, labels: str = "", help: str = "") -> list[str]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        sep = "," if labels else ""
        out, running = head(name, "histogram", help), 0
        for bound, count in zip(self.buckets, counts):
            running += count
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {running}')
        running += counts[-1]
        tail = f"{{{labels}}}" if labels else ""
        out += [f'{name}_bucket{{{labels}{sep}le="+Inf"}} {running}', f"{name}_sum{tail} {total:.6f}",
                f"{name}_count{tail} {running}"]
        return out


class JobMetrics:
    """Filled by the core when a job finishes: per-kind outcomes, queue wait and run time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.finished: dict[tuple[str, str], int] = {}
        self.wait = LatencyHistogram(JOB_BUCKETS)
        self.run = LatencyHistogram(JOB_BUCKETS)

    def job_finished(self, job: AnyJob) -> None:
        end = job.finished or time.monotonic()
        started = job.started or end  # never started: it waited until it was cancelled
        wait, run = started - job.created, end - started
        with self._lock:
            key = (job.kind, job.state)
            self.finished[key] = self.finished.get(key, 0) + 1
        self.wait.observe(wait)
        if job.started:
            self.run.observe(run)
        counts = " ".join(f"{name}={n}" for name, n in sorted(job.counts.items()))
        error = f" error={job.error[:200]!r}" if job.error else ""
        ran = f"{run * 1000:.0f}" if job.started else "-"  # "-": cancelled before it started
        job_log.info("job id=%s seq=%d kind=%s outcome=%s wait_ms=%.0f run_ms=%s %s%s", job.id, job.seq, job.kind,
                     job.state, wait * 1000, ran, counts or "produced=0", error)

    def lines(self) -> list[str]:
        with self._lock:
            finished = sorted(self.finished.items())
        out = head("glassbox_jobs_finished_total", "counter", "Finished jobs by kind and outcome")
        out += [f'glassbox_jobs_finished_total{{kind="{kind}",outcome="{outcome}"}} {n}'
                for (kind, outcome), n in finished]
        out += self.wait.lines("glassbox_job_queue_seconds", help="Time from submission to start (or cancel)")
        out += self.run.lines("glassbox_job_run_seconds", help="Time a job held the device")
        return out


ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class StepMetrics:
    """Filled by the core after every batched step: rows decoded together, step time, prefill."""

    def __init__(self) -> None:
        self.rows = LatencyHistogram(ROW_BUCKETS)  # a histogram of counts, not of seconds
        self.seconds = LatencyHistogram(STEP_BUCKETS)
        self.prefill_tokens = LatencyHistogram((16, 32, 64, 128, 256, 512, 1024))
        self.admitted = 0
        self.retired = 0
        # the worker thread's seconds by what it did: the step's own phases (prefill, decode, publish, the
        # rest of the step), admitting, finishing (saving results), waiting for work. bench.serving.concurrency
        # reads them to say where a served step loses time against the bare one.
        self._lock = threading.Lock()
        self.worker: dict[str, float] = {}

    def spent(self, phase: str, seconds: float) -> None:
        with self._lock:
            self.worker[phase] = self.worker.get(phase, 0.0) + seconds

    def observe(self, report: StepReport, seconds: float) -> None:
        self.seconds.observe(seconds)
        for phase, took in report.phases.items():
            self.spent(phase, took)
        self.spent("step other", max(0.0, seconds - sum(report.phases.values())))
        if report.rows:
            self.rows.observe(report.rows)
        if report.prefill_tokens:
            self.prefill_tokens.observe(report.prefill_tokens)
        self.retired += len(report.finished)

    def lines(self) -> list[str]:
        return (self.rows.lines("glassbox_batch_rows", help="Replies decoded together in one step")
                + self.seconds.lines("glassbox_step_seconds", help="Time of one batched step")
                + self.prefill_tokens.lines("glassbox_step_prefill_tokens",
                                            help="Prompt tokens prefilled in a step that prefilled")
                + self._worker_lines()
                + head("glassbox_batch_admitted_total", "counter", "Replies admitted into the batch")
                + [f"glassbox_batch_admitted_total {self.admitted}"]
                + head("glassbox_batch_retired_total", "counter", "Replies retired from the batch")
                + [f"glassbox_batch_retired_total {self.retired}"])


    def _worker_lines(self) -> list[str]:
        with self._lock:
            spent = sorted(self.worker.items())
        return (head("glassbox_worker_seconds_total", "counter", "The core worker's time by what it did")
                + [f'glassbox_worker_seconds_total{{phase="{phase}"}} {seconds:.6f}' for phase, seconds in spent])


def head(name: str, kind: str, help: str = "") -> list[str]:
    return ([f"# HELP {name} {help}"] if help else []) + [f"# TYPE {name} {kind}"]


def gauge(name: str, value: float, help: str) -> list[str]:
    return head(name, "gauge", help) + [f"{name} {value}"]
