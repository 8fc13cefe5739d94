"""The decode kernel (webapp/chat/model/kernels): right results in every weight format, each row's result the
same whatever the other rows and the thread count, the same on CPUs with and without VNNI, compiled once
per machine, and a clear fallback to torch's kernels where it cannot be compiled."""

from __future__ import annotations

import copy
import ctypes
import os
import platform
import subprocess
import sys

import pytest
import torch

from webapp.chat.model import kernels

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def weights(fmt: str, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(stored weight, scale or None, the float32 weight it stands for)."""
    w = torch.randn(n, k)
    if fmt == "int8":
        q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
        scale = torch.rand(n) / 100
        return q, scale, q.float() * scale[:, None]
    stored = w.to(getattr(torch, fmt))
    return stored, None, stored.float()


def q8(x: torch.Tensor) -> torch.Tensor:
    """x as the int8 kernel sees it: quantized in blocks of 32 (absmax / 127, to nearest even), as float32."""
    M, K = x.shape
    blocks = torch.nn.functional.pad(x, (0, -K % 32)).view(M, -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    q = torch.round(blocks * torch.where(amax > 0, 127 / amax, 0)).clamp(-127, 127)
    return (q * (amax / 127)).view(M, -1)[:, :K]


@pytest.fixture(autouse=True)
def compiled():
    assert kernels.library() is not None, kernels.unavailable_reason  # CI has a C compiler


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("k, n", [(64, 96), (1000, 37), (17, 5)])  # K with a tail, N not a multiple of 4
def test_each_format_computes_the_linear_layer(fmt, k, n):
    torch.manual_seed(0)
    w, scale, dense = weights(fmt, n, k)
    bias, x = torch.randn(n), torch.randn(7, k)
    exact = x.double() @ dense.double().T + bias.double()
    # int8 weights multiply int8 activations (q8_0's blocks of 32), exactly as computed in float64 here
    expected = q8(x).double() @ dense.double().T + bias.double() if fmt == "int8" else exact
    got = kernels.linear(x, w, bias, scale)
    assert got.shape == (7, n) and got.dtype == torch.float32
    assert torch.allclose(got.double(), expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    assert torch.allclose(kernels.linear(x, w, None, scale).double(), expected - bias.double(),
                          rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    # and the quantized activations cost int8 outputs little: under 3% of the largest output here
    assert (got.double() - exact).abs().max() < 0.03 * exact.abs().max()


def build(target, march: list[str]) -> ctypes.CDLL:
    flags = [flag for flag in kernels.FLAGS if not flag.startswith("-march=")]  # the library's, on another CPU
    subprocess.run(["cc", *flags, *march, "-o", str(target), *map(str, kernels.SOURCES)], check=True,
                   capture_output=True)
    lib = ctypes.CDLL(str(target))
    lib.glassbox_linear.argtypes = kernels.library().glassbox_linear.argtypes
    return lib


def has_amx() -> bool:
    return "amx_int8" in kernels._cpu_flags().split()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the portable build is an x86-64 one")
def test_int8_sums_are_the_same_integers_with_and_without_vnni(tmp_path):
    portable = build(tmp_path / "portable.so", ["-march=x86-64-v3"])  # AVX2 and FMA, no AVX-512, no VNNI
    # this CPU's vector kernels (VNNI where it has it), without AMX's tiles, which sum in another order (amx.c)
    vnni = build(tmp_path / "vnni.so", ["-march=native", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"])
    torch.manual_seed(3)
    for m, k, n in [(1, 1024, 96), (5, 1000, 37), (3, 17, 5), (16, 1024, 40)]:
        w, scale, _ = weights("int8", n, k)
        bias, x = torch.randn(n), torch.randn(m, k)
        outs = [torch.empty(m, n) for _ in range(2)]
        for lib, out in zip((portable, vnni), outs):
            assert lib.glassbox_linear(2, x.data_ptr(), m, k, k, w.data_ptr(), n, scale.data_ptr(), bias.data_ptr(),
                                       out.data_ptr(), 1, None, None, 0.0, 0, None) == 0
        assert torch.equal(outs[0], outs[1]), (m, k, n)
        if not has_amx():  # then the vector kernels are the library's
            assert torch.equal(outs[1], kernels.linear(x, w, bias, scale)), (m, k, n)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the portable build is an x86-64 one")
@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8"])
def test_avx2s_tiles_give_the_generic_codes_bits(tmp_path, fmt):
    """On AVX2 without AVX-512 the tiles are written in 8-lane registers (GCC kept the generic 16-lane
    vectors in memory there): the same fused products in the same order, so the same bits as the generic
    code, for one row and for batches, with and without a tail of K."""
    avx2 = build(tmp_path / "avx2.so", ["-march=x86-64-v3"])
    generic = build(tmp_path / "generic.so", ["-march=x86-64-v3", "-DGLASSBOX_GENERIC_TILES"])
    torch.manual_seed(4)
    # one row: outputs four at a time and one at a time (n not a multiple of 4), short and long rows, tails of K
    for m, k, n in [(1, 1024, 96), (1, 1000, 37), (1, 4100, 33), (1, 2048, 41), (5, 1000, 37), (3, 17, 5),
                    (16, 1024, 40), (7, 64, 9)]:
        w, scale, _ = weights(fmt, n, k)
        bias, x = torch.randn(n), torch.randn(m, k)
        outs = [torch.empty(m, n) for _ in range(2)]
        for lib, out in zip((avx2, generic), outs):
            assert lib.glassbox_linear(kernels.KINDS[w.dtype], x.data_ptr(), m, k, k, w.data_ptr(), n,
                                       None if scale is None else scale.data_ptr(), bias.data_ptr(), out.data_ptr(),
                                       2, None, None, 0.0, 0, None) == 0
        assert torch.equal(outs[0], outs[1]), (fmt, m, k, n)


@pytest.mark.parametrize("fmt", ["float32", "int8"])
@pytest.mark.parametrize("bias", [True, False])
def test_the_layer_norm_before_and_the_gelu_and_residual_after_are_torchs(fmt, bias):
    torch.manual_seed(4)
    w, scale, dense = weights(fmt, 70, 96)
    norm = torch.nn.LayerNorm(96, bias=bias)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2)
        if bias:
            norm.bias.normal_()
    x, b = torch.randn(3, 96) * 4 + 1, torch.randn(70)
    residual = torch.randn(3, 70)
    with torch.inference_mode():
        normed = norm(x)
        inputs = q8(normed) if fmt == "int8" else normed
        pre = inputs.double() @ dense.double().T + b.double()
        expected = torch.nn.functional.gelu(pre) + residual.double()
        got = kernels.linear(x, w, b, scale, norm=norm, gelu=True, residual=residual)
        tol = 1e-5 * pre.abs().max().item()
        assert torch.allclose(got.double(), expected, rtol=1e-5, atol=tol)
        # each part alone, too
        assert torch.allclose(kernels.linear(x, w, b, scale, norm=norm).double(), pre, rtol=1e-5, atol=tol)
        assert torch.allclose(kernels.linear(inputs, w, b, scale, gelu=True).double(),
                              torch.nn.functional.gelu(pre), rtol=1e-5, atol=tol)
        assert torch.allclose(kernels.linear(inputs, w, b, scale, residual=residual).double(),
                              pre + residual.double(), rtol=1e-5, atol=tol)
    # GELU itself, over a wide range, against torch's exact erf GELU
    v = torch.linspace(-12, 12, 4099).view(1, -1)
    eye = torch.eye(4099)
    assert torch.allclose(kernels.linear(v, eye, gelu=True), torch.nn.functional.gelu(v), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8"])
def test_a_rows_result_does_not_depend_on_the_other_rows_or_the_threads(fmt):
    torch.manual_seed(1)
    w, scale, _ = weights(fmt, 203, 1040)
    bias, x = torch.randn(203), torch.randn(40, 1040)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([kernels.linear(x[i:i + 1], w, bias, scale) for i in range(40)])
        torch.set_num_threads(2)
        for m in range(1, 41):
            assert torch.equal(kernels.linear(x[:m], w, bias, scale), alone[:m]), m
            assert torch.equal(kernels.linear(x[40 - m:], w, bias, scale), alone[40 - m:]), m
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("k, n", [(1000, 37), (17, 5), (4100, 33), (1024, 64)])  # tails of K and N; whole tiles
def test_a_row_is_the_same_alone_and_at_any_place_in_batches_of_1_to_16(fmt, k, n):
    # the batched paths (AMX's tiles where the CPU has them, the vector kernels' row tiles elsewhere) against
    # each row alone on one thread, among other rows of every size and at every place, on 1 and 2 threads
    torch.manual_seed(5)
    w, scale, _ = weights(fmt, n, k)
    bias, x = torch.randn(n), torch.randn(16, k) * torch.logspace(-2, 2, 16).view(-1, 1)  # rows of all sizes
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([kernels.linear(x[i:i + 1], w, bias, scale) for i in range(16)])
        for t in (1, 2):
            torch.set_num_threads(t)
            for b in range(1, 17):
                rows = torch.randperm(16)[:b]  # b rows in a new order each time
                assert torch.equal(kernels.linear(x[rows], w, bias, scale), alone[rows]), (t, b)
    finally:
        torch.set_num_threads(threads)


def test_it_takes_only_what_it_computes():
    assert not kernels.supports(torch.randn(2, 4).bfloat16(), torch.randn(3, 4))  # float32 rows only
    assert not kernels.supports(torch.randn(2, 4), torch.randn(3, 4).half())
    assert not kernels.supports(torch.randn(2, 4), torch.randn(4, 3).t())  # rows of W must be contiguous
    with kernels.disabled():
        assert not kernels.supports(torch.randn(2, 4), torch.randn(3, 4))
    assert kernels.supports(torch.randn(2, 4), torch.randn(3, 4))
    with pytest.raises(ValueError, match="contiguous float32 vectors"):
        kernels.linear(torch.randn(2, 4), torch.randn(3, 4), torch.randn(3).double())


def run_python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=960,
                          env={**os.environ, "PYTHONPATH": ROOT, **env})


PROBE = ("import torch; from webapp.chat.model import kernels; lib = kernels.library(); "
         "print('kernel' if lib else 'torch:', kernels.unavailable_reason); "
         "from webapp.chat.model.gpt import GPT, Chunk, GPTConfig; "
         "m = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=32)).eval(); c = m.new_cache(); "
         "torch.inference_mode().__enter__(); m.prefill([Chunk([1, 2], c)]); "
         "print(m.decode_step(torch.tensor([[3]]), [c], [2]).shape)")


def test_compiled_once_per_machine_and_cached(tmp_path):
    first = run_python(PROBE, {"XDG_CACHE_HOME": str(tmp_path)})
    assert first.returncode == 0 and first.stdout.startswith("kernel None"), first.stderr
    built = list((tmp_path / "glassbox").glob("linear-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    again = run_python(PROBE, {"XDG_CACHE_HOME": str(tmp_path)})
    assert again.stdout.startswith("kernel None") and built[0].stat().st_mtime_ns == stamp  # not rebuilt
    assert list((tmp_path / "glassbox").iterdir()) == built  # nothing left over from the build


@pytest.mark.parametrize("env, reason", [({"CC": "/bin/false"}, "/bin/false failed"),
                                         ({"GLASSBOX_DECODE_KERNEL": "torch"}, "GLASSBOX_DECODE_KERNEL=torch"),
                                         ({"GLASSBOX_DECODE_KERNEL": "fast"}, "is not 'glassbox' or 'torch'")])
def test_without_the_kernel_decoding_falls_back_to_torch_and_says_why(tmp_path, env, reason):
    result = run_python(PROBE, {"XDG_CACHE_HOME": str(tmp_path), **env})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("torch:") and reason in result.stdout
    assert "torch.Size([1, 64])" in result.stdout  # and the model still decodes
    assert "decode kernel unavailable" in result.stderr  # the log says so


@pytest.mark.parametrize("cache", [torch.float32, torch.bfloat16])
# head sizes of 16's multiples take the register path (64: GPT-2's own), others the plain one; positions
# past a multiple of 16 take its tail; sharp=True makes scores hundreds apart (exp16's underflow)
@pytest.mark.parametrize("nh, hs, pos, sharp", [(16, 64, 799, False), (4, 64, 37, False), (2, 64, 0, False),
                                                (3, 32, 100, False), (2, 128, 20, False), (4, 64, 300, True),
                                                (3, 20, 0, False), (2, 8, 32, False), (2, 24, 40, True)])
def test_attention_writes_the_new_key_and_value_then_attends_over_the_cache(nh, hs, pos, sharp, cache):
    torch.manual_seed(2)
    keys, values = torch.randn(1, nh, 1024, hs).to(cache), torch.randn(1, nh, 1024, hs).to(cache)
    q, k, v = torch.randn(nh, 1, hs) * (30 if sharp else 1), torch.randn(nh, 1, hs) * 3, torch.randn(nh, 1, hs)
    before = keys.clone()
    out = torch.empty(nh, 1, hs)
    assert kernels.attends(q, out, keys)
    kernels.attend(q, k, v, keys, values, pos, out)
    # written as torch writes into the cache: rounded to its dtype, to nearest even
    assert torch.equal(keys[0, :, pos:pos + 1], k.to(cache)) and torch.equal(values[0, :, pos:pos + 1], v.to(cache))
    assert torch.equal(keys[:, :, pos + 1:], before[:, :, pos + 1:])  # nothing else written
    expected = torch.nn.functional.scaled_dot_product_attention(q[None], keys[:, :, :pos + 1].float(),
                                                                values[:, :, :pos + 1].float())
    assert torch.allclose(out, expected[0], atol=1e-5)
    with pytest.raises(ValueError):
        kernels.attend(q, k, v, keys, values, 1024, out)  # past the cache


@pytest.mark.parametrize("precision", ["float32", "bfloat16", "int8"])
def test_a_whole_block_in_one_call_is_its_calls_one_by_one(precision):
    from webapp.chat.model.gpt import GPT, Chunk, GPTConfig
    from webapp.chat.model.precision import apply_precision
    torch.manual_seed(5)
    model = apply_precision(GPT(GPTConfig(block_size=64, vocab_size=64, n_layer=1, n_head=4, n_embd=64)), precision)
    block, positions = model.eval().transformer.h[0], [5, 17, 40]
    caches = [model.new_cache(max_len=64) for _ in positions]
    with torch.inference_mode():
        for cache, n in zip(caches, positions):
            model.prefill([Chunk(torch.randint(0, 64, (n,)).tolist(), cache)])
        x = torch.randn(3, 1, 64)
        # one call per layer norm + linear layer, and per row's attention (each writes its new key and value)
        plain = [None] * len(positions)
        expected = block.mlp.decode(block.attn.decode(x.clone(), block.ln_1, caches, 0, positions, plain), block.ln_2,
                                    0, positions, plain)
        keys, values = [c.k[0] for c in caches], [c.v[0] for c in caches]
        written = [k[0, :, p].clone() for k, p in zip(keys, positions)]
        got = x.clone()
        plan = kernels.plan_block(block._parameters_in_order(), block.ln_1.eps, 4)
        assert plan is not None
        with kernels.disabled():  # refused, untouched: the caller then goes one call at a time
            assert not kernels.block(got, plan, keys, values, positions)
        assert torch.equal(got, x)
        assert kernels.block(got, plan, keys, values, positions)
        assert torch.equal(got, expected)  # the same sums, bit for bit
        assert all(torch.equal(k[0, :, p], w) for k, p, w in zip(keys, positions, written))
        # what the kernel cannot take, it refuses rather than misreads
        assert not kernels.block(torch.randn(3, 1, 128)[..., ::2], plan, keys, values, positions)
        assert not kernels.block(got, plan, keys, values, [5, 17, 64])


def test_a_blocks_plan_follows_its_parameters_when_they_are_replaced_or_moved():
    """The kernel's plan of a block's parameters is made once: a model converted (apply_precision) or moved
    (.half().float()) after it has decoded decodes as one converted or moved before it ever did."""
    from webapp.chat.model.gpt import GPT, Chunk, GPTConfig
    from webapp.chat.model.precision import apply_precision
    config = GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=4, n_embd=64)

    def model():
        torch.manual_seed(7)
        return GPT(config).eval()

    def step(m):
        cache = m.new_cache(max_len=32)
        m.prefill([Chunk(list(range(9)), cache)])
        return m.decode_step(torch.tensor([[9]]), [cache], [9])

    with torch.inference_mode():
        used = model()
        step(used)  # plans made for float32
        assert torch.equal(step(apply_precision(used, "int8")), step(apply_precision(model(), "int8")))
        used, fresh = model(), model()
        step(used)
        assert torch.equal(step(used.half().float()), step(fresh.half().float()))
        assert not torch.equal(step(fresh), step(model()))  # the move changed the weights: a test that can fail
        copied = copy.deepcopy(used)  # a copy makes its own plans (pointers into its own tensors)
        for p in used.parameters():
            p.zero_()
        assert torch.equal(step(copied), step(fresh))


def test_a_block_the_kernel_would_misread_is_refused_and_left_to_the_calls_one_by_one():
    from webapp.chat.model.gpt import GPT, Chunk, GPTConfig
    from webapp.chat.model.precision import apply_precision
    torch.manual_seed(6)
    model = apply_precision(GPT(GPTConfig(block_size=32, vocab_size=64, n_layer=1, n_head=4, n_embd=64)), "int8")
    block, positions = model.eval().transformer.h[0], [3, 9]
    caches = [model.new_cache(max_len=32) for _ in positions]
    keys, values = [c.k[0] for c in caches], [c.v[0] for c in caches]
    params, x = block._parameters_in_order(), torch.randn(2, 1, 64)
    with torch.inference_mode():
        for cache, n in zip(caches, positions):
            model.prefill([Chunk(torch.randint(0, 64, (n,)).tolist(), cache)])
        plan = kernels.plan_block(params, 1e-5, 4)
        assert plan is not None and kernels.block(x.clone(), plan, keys, values, positions)  # the baseline: taken
        # parameters it would misread: no plan at all
        misread = [
            params[:3] + [params[3][:10]] + params[4:],  # a scale too short
            params[:3] + [None] + params[4:],  # int8 without its scales
            params[:1] + [params[1][:32]] + params[2:],  # ln_1's bias too short
        ]
        assert all(kernels.plan_block(bad, 1e-5, 4) is None for bad in misread)
        assert kernels.plan_block(params, 1e-5, 5) is None  # heads that do not divide the width
        # calls that do not match the plan or each other: refused, x untouched
        refused = [
            (x, plan, keys, values, positions[:1]),  # a position short
            (x, plan, keys[:1], values, positions),  # a cache short
            (x, kernels.plan_block(params, 1e-5, 8), keys, values, positions),  # heads that do not match the cache's
        ]
        for case in refused:
            got = case[0].clone()
            assert not kernels.block(got, *case[1:])
            assert torch.equal(got, x)
        # a row count the caches do not match is the caller's mistake, said plainly
        with pytest.raises(ValueError, match="one each"):
            model.decode_step(torch.tensor([[1], [2], [3]]), caches, positions)
        # an x the block refuses (not contiguous) still decodes, one call at a time
        wide = torch.randn(2, 1, 128)[..., ::2]
        with kernels.disabled():
            expected = block.decode(wide.clone(), caches, 0, positions, [None, None])
        assert torch.allclose(block.decode(wide, caches, 0, positions, [None, None]), expected, atol=0.05)


def test_attention_refuses_a_strided_cache_and_keeps_nan_as_nan():
    keys, values = torch.zeros(1, 2, 16, 8), torch.zeros(1, 2, 8, 16).transpose(-1, -2)  # values strided
    q, k, v, out = torch.randn(2, 1, 8), torch.randn(2, 1, 8), torch.randn(2, 1, 8), torch.empty(2, 1, 8)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.attend(q, k, v, keys, values, 3, out)
    keys, values = torch.zeros(1, 2, 16, 8, dtype=torch.bfloat16), torch.zeros(1, 2, 16, 8, dtype=torch.bfloat16)
    k[0, 0, 0] = float("nan")
    kernels.attend(q, k, v, keys, values, 3, out)
    assert torch.isnan(keys[0, 0, 3, 0]) and torch.equal(keys[0, :, 3].isnan(), k.to(torch.bfloat16)[:, 0].isnan())
