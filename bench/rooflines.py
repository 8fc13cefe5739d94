"""The memory roofline every decode figure is set against: the read bandwidth measured on the machine the
benchmark runs on, the bytes one decode step reads (weights at their stored types, each row's keys and
values), and tokens/s = tokens a step × bandwidth ÷ bytes a step.
"""

from __future__ import annotations

import time

import torch

from bench.common import sync


def weight_bytes_per_token(model) -> int:
    """Bytes of weights one decode step reads: every parameter and weight buffer once (lm_head shares wte's
    tensor at float32 and reads all of it), except the position table and, when lm_head has weights of its
    own (bfloat16, int8), the token table: of those a step reads one row."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    skip = {id(model.transformer.wpe.weight)}
    if model.lm_head.weight is not model.transformer.wte.weight:
        skip.add(id(model.transformer.wte.weight))
    return sum(t.numel() * t.element_size() for key, t in tensors.items() if key not in skip)


def bandwidth_gbs(gib: float = 2.0, reps: int = 5, device="cpu") -> dict:
    """Memory read bandwidth, GB/s, best of `reps`, with the current torch threads, over a buffer far
    larger than the caches: `sum` (a pure read) and `mv` (a matrix-vector product, what decoding does)."""
    device = torch.device(device)
    rows = int(gib * 2**30 / 4 / 4096)
    a = torch.randn(rows, 4096, device=device)  # fp32, touched so every page exists
    x = torch.randn(4096, device=device)
    nbytes = a.numel() * 4
    out = {}
    # F821 below is a false positive: the lambdas run only in this loop, before the `del a` after it
    for name, fn in (("sum", lambda: a.sum()), ("mv", lambda: torch.mv(a, x))):  # noqa: F821
        out[name] = nbytes / best_seconds(fn, reps, device) / 1e9
    del a
    return out


def best_seconds(fn, reps: int, device="cpu") -> float:
    """The shortest of `reps` timed calls of fn(), each waited for on the device."""
    best = float("inf")
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return best


def read_bandwidth_gbs(gib: float = 1.0, reps: int = 5, device="cpu") -> float:
    """The machine's read bandwidth as a roofline divides by: the better of bandwidth_gbs's two, GB/s, with the
    current torch threads (measure it at each thread count a benchmark runs)."""
    return max(bandwidth_gbs(gib, reps=reps, device=device).values())


class TurnReads:
    """The read bandwidth taken in the same minutes as the decode turns it divides (call it between turns): a
    `sum` over a float32 buffer far larger than the caches, best of `reps`, GB/s, every reading kept. On a shared
    VM the bandwidth moves between levels within minutes, so a divisor taken once before a run can come from
    another level than the run's turns."""

    def __init__(self, mib: int = 256, reps: int = 3):
        self.buffer = torch.randn(mib * 2**20 // 4)  # touched, so every page exists before the first reading
        self.reps = reps
        self.readings: list[float] = []

    def __call__(self) -> float:
        self.readings.append(self.buffer.numel() * 4 / best_seconds(self.buffer.sum, self.reps) / 1e9)
        return self.readings[-1]


READ_ONCE = "the better of a `sum` and an `mv` over 1 GiB, best of 5, bench.rooflines.read_bandwidth_gbs"
READ_IN_TURNS = ("a `sum` over 256 MiB, best of 3, after every turn of the decode (bench.rooflines.TurnReads; "
                 "--batched: after each batch size's two engines), the median of a thread count's readings")


# -- the roofline: a decode step that did nothing but read its bytes once, at the measured bandwidth ----------
def kv_bytes(config, context: float, element_size: int) -> float:
    """Bytes of keys and values one row's decode step reads when it attends over `context` positions (its new
    one included): a key and a value of n_embd numbers a position, every layer."""
    return 2 * config.n_layer * config.n_embd * context * element_size


def kv_element_size(model) -> int:
    """Bytes of one cached key or value number: the model's KV cache dtype (bfloat16 at the reduced CPU
    precisions, webapp.chat.model.precision), else its activations'."""
    dtype = getattr(model, "kv_dtype", None) or model.transformer.wte.weight.dtype
    return torch.empty((), dtype=dtype).element_size()


def step_bytes(model, contexts) -> float:
    """Bytes one decode step of Glassbox's `model` reads with one row attending over each of `contexts`
    positions: the weights once (weight_bytes_per_token) and each row's keys and values."""
    size = kv_element_size(model)
    return weight_bytes_per_token(model) + sum(kv_bytes(model.config, c, size) for c in contexts)


def mean_context(prompt: int, steps: int) -> float:
    """The mean number of positions `steps` single-token decode steps attend over after a `prompt`-token
    prefill: step i decodes position prompt + i and attends over prompt + i + 1."""
    return prompt + (steps + 1) / 2


def gguf_weight_bytes(path) -> int:
    """Bytes of tensors a llama.cpp decode step of the GGUF file at `path` reads: every tensor at its stored
    type, less the tables it reads one row of (position_embd; token_embd when an output.weight of its own
    is stored, else token_embd is the tied output layer, read whole)."""
    from gguf import GGUFReader  # llama.cpp's gguf-py (in the app's environment: webapp.chat.model.gguf)
    sizes = {t.name: int(t.n_bytes) for t in GGUFReader(str(path)).tensors}
    skip = {"position_embd.weight"} | ({"token_embd.weight"} if "output.weight" in sizes else set())
    return sum(n for name, n in sizes.items() if name not in skip)


LLAMACPP_KV_BYTES = 2  # llama.cpp's default KV cache type is f16


def roofline(rate: float, bytes_per_step: float, bandwidth: float, rows: int = 1) -> tuple[float, float]:
    """(roofline tokens/s, rate ÷ roofline) for a decode rate of `rate` tokens/s whose every step makes `rows`
    tokens reading `bytes_per_step` bytes, at `bandwidth` GB/s."""
    roof = rows * bandwidth * 1e9 / bytes_per_step
    return roof, rate / roof


def roofline_note(bandwidths: dict, each: dict | None = None, how: str = READ_ONCE) -> str:
    """The line a report gives under a table with roofline columns: what was divided by what. `each`: every
    measurement behind a median (thread count -> GB/s per reading), whose range is printed: on a shared VM the
    bandwidth itself moves between runs, and a fraction is only as steady as its divisor. `how`: how the
    bandwidth was read (READ_ONCE, READ_IN_TURNS)."""
    def spread(t) -> str:
        values = (each or {}).get(t) or []
        return f" (each reading {min(values):.1f}–{max(values):.1f}, median used)" if len(values) > 1 else ""
    measured = ", ".join(f"{t} thread{'s' if t != 1 else ''} {bw:.1f} GB/s{spread(t)}" for t, bw in bandwidths.items())
    return ("- roofline tok/s = tokens a step × measured read bandwidth ÷ bytes a step reads (its tensors at their "
            "stored types, lm_head whole, one row of each embedding table; plus each row's keys and values at the "
            "context its steps attend over, a run's mean); fraction = measured ÷ roofline. Read bandwidth "
            f"({how}): {measured}\n")
