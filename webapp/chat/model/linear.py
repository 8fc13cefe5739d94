"""Glassbox's linear layers: the same parameters as nn.Linear, with a decode step's layer done in one call.

`Linear` gives every row the same result whatever else is in the batch (batched decoding must not change a
reply); `DecodingLinear` is the forward both it and precision.WeightOnlyLinear share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor
from torch.nn import functional as F

from webapp.chat.model import kernels
from webapp.nn.rowwise import ONEDNN, onednn_linear


class DecodingLinear:
    """forward() of Glassbox's linear layers (Linear, precision.WeightOnlyLinear): x @ Wᵀ + b (matmul()),
    or, with decode=True, a decode step's layer together with what surrounds it in a block:
        gelu(norm(x) @ Wᵀ + b) + residual, each part only when given.
    Glassbox's kernel does a decode step's layer in one call (webapp/chat/model/kernels; a step is short: a
    call per small operator would cost as much as the layer norms themselves); without the kernel,
    torch's operators compute the same thing one by one."""

    weight: torch.Tensor  # (out, in)
    bias: Any  # (out,) or None
    scale: torch.Tensor | None  # one per output row, for int8 weights
    matmul: Callable[[torch.Tensor], torch.Tensor]
    __call__: Callable[..., Tensor]  # nn.Module's, which calls forward()

    def forward(self, x: Tensor, decode: bool = False, norm: nn.LayerNorm | None = None, gelu: bool = False,
                residual: Tensor | None = None) -> Tensor:
        if not decode:
            return self.matmul(x)
        if kernels.supports(x, self.weight):
            return kernels.linear(x, self.weight, self.bias, self.scale, norm, gelu, residual)
        y = self.decode_matmul(x if norm is None else norm(x))
        if gelu:
            y = F.gelu(y)
        return y if residual is None else residual + y

    def decode_matmul(self, x: Tensor) -> Tensor:
        """x @ Wᵀ + b for a decode step's few rows where the kernel cannot run: matmul() unless a layer
        has a path of its own for few rows (precision.WeightOnlyLinear's int8)."""
        return self.matmul(x)


class Linear(DecodingLinear, nn.Linear):
    """nn.Linear (same parameters, same names) whose CPU inference gives every row the same result
    whatever else is in the batch.

    Batched decoding must not change a reply (docs/architecture.md, "The same reply as alone"). A
    decode step (decode=True) runs Glassbox's own kernel (webapp/chat/model/kernels): each output summed in
    one fixed order, and the weights streamed at the machine's bandwidth for a single row. Prefill, and
    decoding where that kernel cannot be compiled, run oneDNN's inner product: for two or more rows it
    computes each row with the same reduction order, bit for bit, whatever the number of rows; a single
    row takes a matrix-vector path whose sums are ordered differently, so one row is run as two.
    Training, autograd, other devices and float16 keep F.linear.
    """

    scale = None  # WeightOnlyLinear's int8 weights have one per output row; float weights none

    def matmul(self, x: Tensor) -> Tensor:
        if not _batch_invariant(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        return onednn_linear(x, self.weight, self.bias)


def _batch_invariant(x: Tensor, weight: Tensor) -> bool:
    """Whether x @ weight.T may take the batch-invariant oneDNN path."""
    return (ONEDNN and x.device.type == "cpu" and weight.dtype in (torch.float32, torch.bfloat16)
            and x.dtype == weight.dtype and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling())
