"""The decode kernels: (linear.c) y = (x @ Wᵀ) * scale + b for the few rows of a decode step, with float32,
bfloat16 or int8 weights (int8 by int8: x quantized in blocks of 32, as llama.cpp's q8_0), each row's result
the same whatever the other rows are; and (attend.c) one new token's attention over its own KV cache.

It is compiled on first use for the machine it runs on (`cc -O3 -march=native -fopenmp`), cached under
$XDG_CACHE_HOME/glassbox (or ~/.cache/glassbox) by a hash of the source, the compiler and the CPU, and
called through ctypes: no build step at install time and no Python headers. Without a C compiler (or
with GLASSBOX_DECODE_KERNEL=torch) decoding uses torch's kernels instead: slower for one row, the same
row invariance, and a warning in the log says so.

It shares torch's OpenMP runtime (torch's libgomp is loaded first and satisfies the kernel's), and runs on
as many threads as torch's intra-op pool, so it follows GLASSBOX_TORCH_THREADS like every other operator.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger("glassbox.kernels")

SOURCES = [Path(__file__).with_name(name)
           for name in ("linear.c", "linear_int8.c", "attend.c", "amx.c", "dequantize.c")]
HEADERS = [Path(__file__).with_name(name)
           for name in ("vectors.h", "tiles.h", "linear_avx2.h")]  # in the cache's key too
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11"]
KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}  # the kernels' formats (vectors.h, linear.c)

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_tried = False
unavailable_reason: str | None = None  # why torch's kernels decode instead (None: the kernel is in use)
_disabled = 0  # > 0 inside disabled(): benchmarks and tests compare with torch's kernels


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "glassbox"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


COMPILE_TIMEOUT_SECONDS = 900


def _compile(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # built aside, then renamed: never half a file
        built = Path(tmp) / target.name
        # a first start on a busy machine compiles slowly, and giving up means decoding on torch's slower
        # kernels until the next start: a generous bound, only against a compiler that hangs
        result = subprocess.run([compiler, *FLAGS, "-o", str(built), *map(str, SOURCES)], capture_output=True,
                                text=True, timeout=COMPILE_TIMEOUT_SECONDS)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-500:]}")
        os.replace(built, target)


def library() -> ctypes.CDLL | None:
    """The compiled kernel, compiled and loaded on the first call; None when it cannot be (see
    unavailable_reason) or when GLASSBOX_DECODE_KERNEL=torch."""
    global _library, _tried, unavailable_reason
    if _tried:
        return _library
    with _lock:
        if _tried:
            return _library
        try:
            _library = _load()
        except Exception as error:  # no compiler, a read-only home, a failed build: torch's kernels decode
            unavailable_reason = str(error) or type(error).__name__
            log.warning("decode kernel unavailable (%s): decoding with torch's kernels", unavailable_reason)
        _tried = True
        return _library


def _load() -> ctypes.CDLL:
    choice = os.environ.get("GLASSBOX_DECODE_KERNEL", "glassbox").strip().lower() or "glassbox"
    if choice == "torch":
        raise RuntimeError("GLASSBOX_DECODE_KERNEL=torch")
    if choice != "glassbox":
        raise RuntimeError(f"GLASSBOX_DECODE_KERNEL={choice!r} is not 'glassbox' or 'torch'")
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise RuntimeError("no C compiler (cc or gcc) on PATH")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    code = [path.read_text() for path in (*SOURCES, *HEADERS)]
    key = hashlib.sha256("\n".join([*code, compiler, version, " ".join(FLAGS), _cpu_flags()]).encode()).hexdigest()[:16]
    target = cache_dir() / f"linear-{key}.so"
    if not target.exists():
        log.info("compiling the decode kernel for this CPU: %s", target)
        _compile(compiler, target)
    lib = ctypes.CDLL(str(target))
    lib.glassbox_linear.restype = ctypes.c_int
    lib.glassbox_linear.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                    ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                    ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float,
                                    ctypes.c_int, ctypes.c_void_p]
    lib.glassbox_block.restype = ctypes.c_int
    lib.glassbox_block.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                   ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p,
                                   ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    lib.glassbox_attend.restype = ctypes.c_int
    lib.glassbox_attend.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                    ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                    ctypes.c_void_p, ctypes.c_int]
    lib.glassbox_dequantize.restype = ctypes.c_int
    lib.glassbox_dequantize.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                                        ctypes.c_void_p, ctypes.c_int]
    return lib


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Decode with torch's kernels inside this block (a benchmark's baseline; the fallback's tests)."""
    global _disabled
    _disabled += 1
    try:
        yield
    finally:
        _disabled -= 1


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether linear() can take these: float32 rows on the CPU and weights in one of its formats."""
    return (not _disabled and x.device.type == "cpu" and x.dtype == torch.float32 and weight.device.type == "cpu"
            and weight.dtype in KINDS and weight.layout == torch.strided and weight.is_contiguous()
            and library() is not None)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           scale: torch.Tensor | None = None, norm: torch.nn.LayerNorm | None = None, gelu: bool = False,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """gelu(norm(x) @ weightᵀ * scale + bias) + residual, each part only when given, for x (..., K) float32,
    weight (N, K) float32/bfloat16/int8, scale and bias (N,) float32, norm a LayerNorm over K, residual
    shaped as the result -> (..., N) float32. With int8 weights the (normed) x is quantized to int8 first,
    per row in blocks of 32 (linear.c, tile_q8). Call supports() first."""
    K, N = x.shape[-1], weight.shape[0]
    rows = x.reshape(-1, K)
    if not rows.is_contiguous():
        rows = rows.contiguous()
    if weight.shape[1] != K:
        raise ValueError(f"x has {K} features, the weights {weight.shape[1]}")
    vectors = (scale, bias) if norm is None else (scale, bias, norm.weight, norm.bias)
    for t in vectors:
        if t is not None and (t.dtype != torch.float32 or not t.is_contiguous() or t.dim() != 1):
            raise ValueError("scale, bias and the norm's parameters must be contiguous float32 vectors")
    if (scale is not None and scale.numel() != N) or (bias is not None and bias.numel() != N):
        raise ValueError("scale and bias must have one value per output")
    if weight.dtype == torch.int8 and scale is None:
        raise ValueError("int8 weights need their scales")
    if norm is not None and (norm.weight is None or norm.weight.numel() != K):
        raise ValueError("the layer norm must have a weight over the input's features")
    out = torch.empty(rows.shape[0], N)
    if residual is not None:
        if residual.dtype != torch.float32 or residual.shape[-1] != N or residual.numel() != out.numel():
            raise ValueError("residual must be float32, shaped as the result")
        residual = residual.contiguous()
    assert _library is not None  # the callers asked supports() first
    status = _library.glassbox_linear(
        KINDS[weight.dtype], rows.data_ptr(), rows.shape[0], K, K, weight.data_ptr(), N,
        None if scale is None else scale.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(),
        torch.get_num_threads(), None if norm is None else norm.weight.data_ptr(),
        None if norm is None or norm.bias is None else norm.bias.data_ptr(), 0.0 if norm is None else norm.eps,
        int(gelu), None if residual is None else residual.data_ptr())
    if status != 0:
        raise RuntimeError(f"decode kernel refused its arguments ({status})")
    return out.view(*x.shape[:-1], N)


@dataclass(frozen=True)
class BlockPlan:
    """A transformer block's parameters, checked once for glassbox_block: their format and their pointers in
    nanoGPT's order (the tensors are held, so the pointers stay valid as long as the plan does)."""
    kind: int
    n_embd: int
    n_head: int
    eps: float
    tensors: tuple[torch.Tensor | None, ...]
    pointers: ctypes.Array  # type: ignore[type-arg]


def plan_block(params: list[torch.Tensor | None], eps: float, n_head: int) -> BlockPlan | None:
    """The plan for block() of a block with these parameters (nanoGPT's order: linear.c, glassbox_block; scales
    and biases may be None), or None when the kernel cannot take them (then call per layer)."""
    weights = [w for w in (params[2], params[5], params[10], params[13]) if w is not None]
    if len(weights) != 4 or library() is None:
        return None
    kind = KINDS.get(weights[0].dtype)
    C = weights[0].shape[-1]
    if kind is None or C % n_head:
        return None
    shapes = (3 * C, C), (C, C), (4 * C, C), (C, 4 * C)
    if any(w.dtype != weights[0].dtype or w.device.type != "cpu" or not w.is_contiguous() or tuple(w.shape) != shape
           for w, shape in zip(weights, shapes)):
        return None
    # each vector's length: ln_1 C, C; c_attn scale, bias 3C; c_proj C; ln_2 C, C; c_fc 4C; mlp c_proj C
    sizes = dict(zip((0, 1, 3, 4, 6, 7, 8, 9, 11, 12, 14, 15), (C, C, 3 * C, 3 * C, C, C, C, C, 4 * C, 4 * C, C, C)))
    required = (0, 8, 3, 6, 11, 14) if kind == KINDS[torch.int8] else (0, 8)  # norms' weights; int8's scales
    if any(params[i] is None for i in required):
        return None
    if any(t is not None and (t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous()
                              or t.numel() != sizes[i]) for i, t in ((i, params[i]) for i in sizes)):
        return None
    pointers = (ctypes.c_void_p * 16)(*(None if t is None else t.data_ptr() for t in params))
    return BlockPlan(kind, C, n_head, eps, tuple(params), pointers)


def block(x: torch.Tensor, plan: BlockPlan, keys: list[torch.Tensor], values: list[torch.Tensor],
          positions: list[int]) -> bool:
    """One transformer block's decode step in place on x (B, 1, C), float32, each row a sequence of its own:
    x += attention(ln_1(x)); x += mlp(ln_2(x)), the same sums as a call per layer (linear(), attend()).
    plan: the block's parameters (plan_block); keys[r], values[r]: row r's cache of this layer,
    (1, nh, max_len, hs); positions[r]: row r's new position. -> False, having done nothing, when the kernel
    cannot take these (then call per layer)."""
    B, C, n_head = x.shape[0], plan.n_embd, plan.n_head
    if (_disabled or x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous()
            or x.numel() != B * C or x.shape[-1] != C or not B == len(keys) == len(values) == len(positions)
            or (x.requires_grad and torch.is_grad_enabled())):
        return False
    cache = keys[0]
    if (cache.dtype not in (torch.float32, torch.bfloat16) or cache.device.type != "cpu"
            or any(t.shape != cache.shape or t.dtype != cache.dtype or not t.is_contiguous() for t in (*keys, *values))
            or not 0 <= min(positions) <= max(positions) < cache.shape[-2] or cache.shape[-3] != n_head
            or cache.shape[-1] != C // n_head or cache.numel() != n_head * cache.shape[-2] * (C // n_head)):
        return False
    assert _library is not None  # plan_block found it
    status = _library.glassbox_block(
        plan.kind, KINDS[cache.dtype], x.data_ptr(), B, C, n_head, plan.pointers, plan.eps,
        (ctypes.c_void_p * B)(*(t.data_ptr() for t in keys)), (ctypes.c_void_p * B)(*(t.data_ptr() for t in values)),
        (ctypes.c_int64 * B)(*positions), cache.shape[-2], torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"decode block kernel failed ({status})")
    return True


def dequantize(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """(weight (N, K) int8 * scale (N,) float32[:, None]).to(dtype), float32 or bfloat16, the same bits, in one
    pass on torch's threads (dequantize.c); None when the kernel is not in use or cannot take these (then
    compute it with torch)."""
    if (_disabled or dtype not in (torch.float32, torch.bfloat16) or weight.dtype != torch.int8 or weight.dim() != 2
            or scale.dtype != torch.float32 or scale.shape != weight.shape[:1]
            or not all(t.device.type == "cpu" and t.is_contiguous() for t in (weight, scale))
            or library() is None):
        return None
    out = torch.empty(weight.shape, dtype=dtype)
    assert _library is not None
    status = _library.glassbox_dequantize(weight.data_ptr(), scale.data_ptr(), weight.shape[0], weight.shape[1],
                                          KINDS[dtype], out.data_ptr(), torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"dequantize kernel failed ({status})")
    return out


def attends(q: torch.Tensor, out: torch.Tensor, keys: torch.Tensor) -> bool:
    """Whether attend() can take these: contiguous float32 queries and outputs, and a contiguous float32
    or bfloat16 cache, on the CPU."""
    return (not _disabled and all(t.device.type == "cpu" and t.is_contiguous() for t in (q, out, keys))
            and q.dtype == out.dtype == torch.float32 and keys.dtype in (torch.float32, torch.bfloat16)
            and library() is not None)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, pos: int,
           out: torch.Tensor) -> None:
    """Write one new token's key and value at `pos` of its own cache (rounded to the cache's dtype), then
    its attention over positions 0..pos into out. q, k, v, out: nh * hs contiguous float32 (e.g.
    (1, nh, 1, hs)); keys, values (1, nh, max_len, hs), float32 or bfloat16. Call attends() first."""
    nh, max_len, hs = keys.shape[-3:]
    if not (q.numel() == k.numel() == v.numel() == out.numel() == nh * hs and values.shape == keys.shape
            and values.dtype == keys.dtype and k.dtype == v.dtype == torch.float32 and 0 <= pos < max_len):
        raise ValueError("attend: q, k, v and out hold one token of every head; keys and values share a shape")
    if not all(t.is_contiguous() for t in (q, k, v, keys, values, out)):
        raise ValueError("attend: every tensor must be contiguous")
    assert _library is not None  # the callers asked supports() first
    status = _library.glassbox_attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), KINDS[keys.dtype], keys.data_ptr(),
                                      values.data_ptr(), nh, pos, max_len, hs, out.data_ptr(),
                                      torch.get_num_threads())
    if status != 0:
        raise RuntimeError(f"decode attention kernel failed ({status})")


__all__ = ["BlockPlan", "attend", "attends", "block", "cache_dir", "dequantize", "disabled", "library", "linear",
           "plan_block", "supports", "unavailable_reason"]
