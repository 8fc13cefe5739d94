"""How many intra-op threads a piece of torch work may use, on the thread that runs it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run this thread's torch work on `count` intra-op threads (0: leave as is), then restore."""
    import torch
    if count <= 0:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def one_torch_thread() -> AbstractContextManager[None]:
    """Run this thread's torch work single-threaded, so that it never starts an OpenMP thread pool.

    libgomp gives each thread that runs parallel work its own pool; once a process has more pool
    threads than CPUs, idle pool threads stop spinning after ~100 spins and sleep between operations.
    A model loaded with parallel work on the main thread (a factory's random init, a dtype
    conversion) made the core's worker decode measurably slower on 2 cores (docs/benchmarks-history.md,
    "Fast decoding (#5)")."""
    return torch_threads(1)
