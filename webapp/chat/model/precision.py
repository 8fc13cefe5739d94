"""The chat model's precision (GLASSBOX_DTYPE): how its weights are stored and what its activations are.

    float32   exact: replies are the seed's, bit for bit, alone or batched (the default on CPU)
    bfloat16  on the CPU: bfloat16 weights and KV cache, float32 activations (half the bytes a token
              reads); on a GPU: bfloat16 throughout (the default there)
    float16   16-bit throughout, for GPUs (CPU kernels for float16 are slow)
    int8      CPU only: every Linear's weights as int8 with one float32 scale per output row
              (symmetric, absmax / 127), a bfloat16 KV cache; a decode step multiplies them by its
              activations quantized to int8 too, in blocks of 32 (as llama.cpp's q8_0 does)

A decode step is bound by the bytes of weights (and keys and values) it reads, so fewer bytes is speed. On
the CPU the reduced precisions change what is stored, and int8 the inputs of its matrix products; layer
norms, attention's sums and everything between the products stay float32. Only float32 is exact; the
others change the logits in their last bits or more, and so, now and then, a token. docs/chat_model.md
("Precisions") gives the speed and what replies lose.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.nn import functional as F

from webapp.chat.model import kernels
from webapp.chat.model.arena import into_huge_pages
from webapp.chat.model.gpt import GPT
from webapp.chat.model.linear import DecodingLinear
from webapp.nn.rowwise import onednn_bfloat16, onednn_linear

PRECISIONS = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
              "float16": "float16", "fp16": "float16", "int8": "int8"}


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


class WeightOnlyLinear(DecodingLinear, nn.Module):
    """A Linear whose weights are stored in fewer bytes (bfloat16, or int8 with one scale per output row)
    and widened to float32 as they are used: y = (x @ W_qᵀ) * scale + b, float32 in and out.

    int8: W_q = round(W / scale), scale = max |W_row| / 127, so each weight is off by half a step at most.
    Decoding runs Glassbox's kernel (webapp/chat/model/kernels), which reads the stored bytes once per step and
    sums each row alone; for int8 it quantizes each row of x in blocks of 32 and multiplies int8 by int8.
    Prefill (and every other call of many rows) runs oneDNN's inner product, which computes each row alone
    too: bfloat16 weights as they are; int8 weights dequantized (W_q * scale) a block of output rows at a
    time (int8_matmul). A decode step without the kernel runs torch's weight-only int8 matmul, in bfloat16,
    which reads the int8 bytes themselves: for a few rows, dequantizing would cost more than the product."""

    def __init__(self, linear: nn.Linear, weights: str):
        super().__init__()
        w = linear.weight.detach().float()  # (N, K)
        if weights == "int8":
            scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127  # (N,)
            self.register_buffer("weight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
            self.register_buffer("scale", scale.contiguous())
        else:
            self.register_buffer("weight", w.to(torch.bfloat16).contiguous())
            self.scale = None
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().float(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # (N, C_in)
        if rows.requires_grad and torch.is_grad_enabled():  # a gradient through it (attribution patching):
            # oneDNN's inner product has no backward; the stored weights widened to float32 have
            weight = self.weight.float() if self.scale is None else dequantized(self.weight, self.scale, torch.float32)
            return self._finish(F.linear(rows.float(), weight), x)
        if self.scale is None:
            y = onednn_linear(rows.to(torch.bfloat16), self.weight, None).float()
        else:
            y = int8_matmul(rows, self.weight, self.scale)
        return self._finish(y, x)

    def decode_matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale is None:
            return self.matmul(x)
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)  # (N, C_in)
        if self.in_features % 16:  # torch's int8 kernel crashes on such widths: dequantize instead
            y = onednn_linear(rows, dequantized(self.weight, self.scale, torch.bfloat16), None).float()
        else:
            y = torch._weight_int8pack_mm(rows.contiguous(), self.weight, self.scale.to(torch.bfloat16)).float()
        return self._finish(y, x)

    def _finish(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weights={self.weight.dtype}"


DEQUANTIZE_BLOCK = 1 << 22  # int8 weights dequantized at once: a whole layer of a 254M model, a block of its lm_head


def int8_dtype() -> torch.dtype:
    """What int8_matmul dequantizes to: bfloat16 where oneDNN has a bfloat16 inner product (AVX-512, AMX:
    the speed of bfloat16's prefill), float32 elsewhere (where bfloat16's would be widened anyway)."""
    return torch.bfloat16 if onednn_bfloat16() else torch.float32


def int8_matmul(rows: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """rows (M, K) float32 @ (weight (N, K) int8 * scale (N,))ᵀ -> (M, N) float32: a block of the weight's
    output rows at a time is dequantized (W_q * scale, exact in float32 but for the product's one rounding;
    rounded to bfloat16 where int8_dtype() says) and multiplied by rows in that dtype by oneDNN's inner
    product, whose every row is computed alike whatever the number of rows (one row run as two): a GEMM's
    speed, where torch's weight-only int8 kernel multiplies many rows at a fraction of it. The blocks
    depend on the weight's shape alone, never on the rows."""
    dtype = int8_dtype()
    rows = rows.to(dtype)
    n, k = weight.shape
    step = max(1, DEQUANTIZE_BLOCK // k)
    if step >= n:
        return onednn_linear(rows, dequantized(weight, scale, dtype), None).float()
    out = torch.empty(rows.shape[0], n)
    for start in range(0, n, step):
        block = dequantized(weight[start:start + step], scale[start:start + step], dtype)
        out[:, start:start + step] = onednn_linear(rows, block, None)
    return out


def dequantized(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(weight (N, K) int8 * scale (N,)[:, None]).to(dtype): by the decode kernel's library in one pass where
    it is in use, else by torch, the same bits either way."""
    fast = kernels.dequantize(weight, scale, dtype)
    return fast if fast is not None else (weight * scale[:, None]).to(dtype)


def apply_precision(model: nn.Module, precision: str) -> nn.Module:
    """Convert a model in place to a precision (a canonical name, see parse_precision) -> the model.
    On the CPU, bfloat16 and int8 replace every nn.Linear (lm_head included, untied from the embedding,
    which stays float32 for lookups) by a WeightOnlyLinear; on other devices bfloat16 and float16 cast
    the whole model. On the CPU the large weights then live in huge pages (arena.py): the same bits, read
    faster."""
    precision = PRECISIONS.get(precision, precision)
    if precision not in ("float32", "bfloat16", "float16", "int8"):
        raise PrecisionError(f"unknown dtype {precision!r}: use one of {', '.join(PRECISIONS)}")
    on_cpu = next(model.parameters()).device.type == "cpu"
    if precision == "float32" or precision == "float16" or (precision == "bfloat16" and not on_cpu):
        model = model.to(getattr(torch, precision))
        return into_huge_pages(model) if on_cpu else model
    if not on_cpu:
        raise PrecisionError("dtype 'int8' (weight-only int8) runs on the CPU only: use bfloat16 on a GPU")
    model.float()
    linears = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    for name, linear in linears:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, WeightOnlyLinear(linear, precision))
    if isinstance(model, GPT):  # keys and values in 16 bits too: half the bytes attention reads
        model.kv_dtype = torch.bfloat16
    return into_huge_pages(model)


__all__ = ["PRECISIONS", "PrecisionError", "WeightOnlyLinear", "apply_precision", "int8_matmul",
           "parse_precision"]
