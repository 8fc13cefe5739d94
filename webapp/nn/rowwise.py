"""A linear layer whose every row gets the same numbers whatever else is in the batch, on the CPU: what
batched decoding (webapp/chat/model/linear.py) and the Loop lab's batched runs (webapp/loops/model/looped.py)
both need, so that a reply or a table run beside others is bit for bit itself alone. Both models import it
from here; neither imports the other."""

from __future__ import annotations

import functools

import torch
from torch import Tensor


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x @ weightᵀ + bias through oneDNN's inner product, one row run as two: each row's sums in one
    order whatever else is in the batch (oneDNN computes two or more rows alike; a lone row takes a
    matrix-vector path whose sums are ordered differently)."""
    rows = x.reshape(-1, x.size(-1))  # (N, C_in)
    n = rows.size(0)
    if n == 1:
        rows = rows.expand(2, -1)
    y: Tensor
    if rows.dtype == torch.bfloat16 and not onednn_bfloat16():
        # a CPU without bfloat16 inner products (AVX2 only): the same weights widened exactly to float32,
        # whose inner product computes each row alike too; the result rounded back to bfloat16
        y = torch.ops.mkldnn._linear_pointwise(rows.float().contiguous(), weight.float(),
                                               None if bias is None else bias.float(), "none", [], "")
        y = y.to(torch.bfloat16)
    else:
        y = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), weight, bias, "none", [], "")
    return y[:n].view(*x.shape[:-1], -1)


ONEDNN: bool = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]


@functools.cache
def onednn_bfloat16() -> bool:
    """Whether oneDNN has a bfloat16 inner product on this CPU (it refuses to create one without AVX-512)."""
    try:
        ones = torch.ones(2, 16, dtype=torch.bfloat16)
        torch.ops.mkldnn._linear_pointwise(ones, ones, None, "none", [], "")
    except RuntimeError:
        return False
    return True
