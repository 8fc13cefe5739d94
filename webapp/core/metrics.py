"""Prometheus text exposition of the core's counters and a request-latency histogram."""

from __future__ import annotations

import threading

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LatencyHistogram:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = [0] * (len(BUCKETS) + 1)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        with self._lock:
            self._sum += seconds
            for i, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    self._counts[i] += 1
                    return
            self._counts[-1] += 1

    def lines(self, name: str) -> list[str]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        out, running = [f"# TYPE {name} histogram"], 0
        for bound, count in zip(BUCKETS, counts):
            running += count
            out.append(f'{name}_bucket{{le="{bound}"}} {running}')
        running += counts[-1]
        out += [f'{name}_bucket{{le="+Inf"}} {running}', f"{name}_sum {total:.6f}", f"{name}_count {running}"]
        return out


def exposition(core, latency: LatencyHistogram) -> str:
    counters = dict(core.counters)
    lines = [
        "# TYPE glassbox_queue_length gauge", f"glassbox_queue_length {core.queue_length()}",
        "# TYPE glassbox_running_jobs gauge", f"glassbox_running_jobs {int(core.running is not None)}",
        "# TYPE glassbox_open_streams gauge", f"glassbox_open_streams {core.open_streams}",
        "# TYPE glassbox_ready gauge", f"glassbox_ready {int(core.ready.is_set())}",
        "# TYPE glassbox_jobs_total counter",
    ]
    for outcome in ("submitted", "done", "cancelled", "failed"):
        lines.append(f'glassbox_jobs_total{{outcome="{outcome}"}} {counters.get(outcome, 0)}')
    lines += ["# TYPE glassbox_tokens_total counter", f"glassbox_tokens_total {counters.get('tokens', 0)}",
              "# TYPE glassbox_loop_rows_total counter", f"glassbox_loop_rows_total {counters.get('rows', 0)}",
              "# TYPE glassbox_model_load_seconds gauge"]
    lines += [f'glassbox_model_load_seconds{{model="{name}"}} {seconds:.3f}'
              for name, seconds in core.load_seconds.items()]
    lines += latency.lines("glassbox_request_seconds")
    return "\n".join(lines) + "\n"
