"""A model's weights moved into one block of memory backed by huge pages (2 MiB), in the order the model
holds them.

A decode step streams every weight from memory once. In 4 KiB pages that stream crosses a page, and needs
a new address translation, every 4 KiB; the CPU's prefetchers stop at each such boundary too. Linux gives
a process huge pages only where it asks for them (transparent_hugepage "madvise", the usual default), so
the weights are copied into one private anonymous mapping that asks (MADV_HUGEPAGE) before it is written.
The values are the same bits; only where they live changes (docs/benchmarks.md, "Weights in huge pages").
"""

from __future__ import annotations

import mmap

import torch
from torch import nn

MIN_BYTES = 1 << 16  # smaller tensors (layer norms, biases) stay where they are: no stream to speed up
HUGE_PAGE = 2 << 20
ALIGN = 4096  # each tensor starts on a page of its own: its rows' alignment as before, or better


def into_huge_pages(model: nn.Module) -> nn.Module:
    """Move `model`'s large CPU parameters and buffers into one huge-page mapping (in place; returns the
    model). A tensor shared by two modules (tied weights) stays shared. Where the system has no
    MADV_HUGEPAGE, or the weights are not plain contiguous CPU tensors, the model is left as it is."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return model
    tensors = {t.data_ptr(): t for t in (*model.parameters(), *model.buffers())
               if t.device.type == "cpu" and t.nbytes >= MIN_BYTES}
    if not tensors or not all(t.is_contiguous() and not t.is_sparse for t in tensors.values()):
        return model
    offsets, total = {}, 0
    for ptr, t in tensors.items():
        offsets[ptr] = total
        total += -(-t.nbytes // ALIGN) * ALIGN
    memory = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        memory.madvise(mmap.MADV_HUGEPAGE)  # before the first write: the pages are made huge as they are touched
    except OSError:  # a kernel built without transparent huge pages: the same copy, in 4 KiB pages
        pass
    arena = torch.frombuffer(memory, dtype=torch.uint8)  # keeps `memory` mapped while any view of it lives
    start = -arena.data_ptr() % HUGE_PAGE
    moved: dict[int, torch.Tensor] = {}

    def move(t: torch.Tensor) -> torch.Tensor:
        ptr = t.data_ptr()
        if ptr not in tensors or t.shape != tensors[ptr].shape:
            return t
        if ptr not in moved:
            at = start + offsets[ptr]
            moved[ptr] = arena[at:at + t.nbytes].view(t.dtype).view(t.shape).copy_(t)
        return moved[ptr]

    with torch.no_grad():
        return model._apply(move)  # type: ignore[no-untyped-call,no-any-return]  # every module's own _apply runs (plans dropped)


__all__ = ["into_huge_pages"]
