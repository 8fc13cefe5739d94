"""The chat model's precision (GLASSBOX_DTYPE): how its weights are stored and what its activations are.

    float32   exact: replies are the seed's, bit for bit, alone or batched (the default on CPU)
    bfloat16  16-bit weights and activations: half the bytes a token reads (the default on GPU)
    float16   16-bit, for GPUs (CPU kernels for float16 are slow)
    int8      weight-only int8: every Linear's weights as int8 with one scale per output row
              (symmetric, absmax / 127), activations in bfloat16; a quarter of float32's bytes

A decode step is bound by the bytes of weights it reads, so fewer bytes per weight is speed. Only
float32 is exact; the others change the logits in their last bits or more, and so, now and then, a
token. docs/benchmarks.md ("Precisions") measures speed and what the replies lose on this machine.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

PRECISIONS = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
              "float16": "float16", "fp16": "float16", "int8": "int8"}

# Each precision's activations (and KV cache): the dtype the model runs in.
ACTIVATIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
               "int8": torch.bfloat16}


class PrecisionError(ValueError):
    """An unknown precision, or one this device cannot run; the message says which are known."""


def parse_precision(name: str | torch.dtype | None, device: torch.device) -> str:
    """A precision's canonical name; None or "" = bfloat16 on GPU, float32 on CPU."""
    if isinstance(name, torch.dtype):
        name = str(name).removeprefix("torch.")
    if not name:
        return "bfloat16" if device.type == "cuda" else "float32"
    try:
        precision = PRECISIONS[str(name).lower()]
    except KeyError:
        raise PrecisionError(f"unknown dtype {name!r}: use one of {', '.join(PRECISIONS)}") from None
    if precision == "int8" and device.type != "cpu":
        raise PrecisionError("dtype 'int8' (weight-only int8) runs on the CPU only: use bfloat16 on a GPU")
    return precision


class Int8Linear(nn.Module):
    """A Linear whose weights are stored as int8, one float scale per output row:
    y = x @ (scale * W_q)ᵀ + b, W_q = round(W / scale), scale = max |W_row| / 127.

    torch's weight-only int8 kernel (_weight_int8pack_mm) reads the int8 weights and scales each
    output once; it computes every row of x alone, so a batched row is the same as the row alone."""

    def __init__(self, linear: nn.Linear, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        w = linear.weight.detach().float()  # (N, K), quantized from float32 whatever it was stored as
        scale = w.abs().amax(dim=1).clamp(min=torch.finfo(dtype).tiny) / 127  # (N,)
        # The kernel takes scales in the activations' dtype: quantize against the scale it will use
        # (rounded up, so no weight falls outside -127..127), so each weight is off by half a step at most.
        rounded = scale.to(dtype)
        rounded = torch.where(rounded.float() < scale, torch.nextafter(rounded, torch.full_like(rounded, math.inf)),
                              rounded)
        scale = rounded.float()
        self.register_buffer("weight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale.to(dtype))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(dtype),
                                                                  requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x):
        rows = x.reshape(-1, self.in_features)  # (N, C_in)
        y = torch._weight_int8pack_mm(rows.contiguous(), self.weight, self.scales)  # (N, C_out)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def apply_precision(model: nn.Module, precision: str) -> nn.Module:
    """Convert a model in place to a precision (a canonical name, see parse_precision) -> the model.
    int8 replaces every nn.Linear (lm_head included, untied from the embedding, which stays
    bfloat16: a lookup reads one row) by an Int8Linear."""
    precision = PRECISIONS.get(precision, precision)
    if precision not in ACTIVATIONS:
        raise PrecisionError(f"unknown dtype {precision!r}: use one of {', '.join(PRECISIONS)}")
    if precision != "int8":
        return model.to(ACTIVATIONS[precision])
    linears = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    for name, linear in linears:  # quantized from the weights as loaded, before the cast below
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, Int8Linear(linear))
    return model.to(torch.bfloat16)  # embeddings, layer norms; int8 buffers keep their dtype


__all__ = ["ACTIVATIONS", "Int8Linear", "PRECISIONS", "PrecisionError", "apply_precision", "parse_precision"]
