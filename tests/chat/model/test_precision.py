"""Precisions (webapp/chat/model/precision.py): int8 weights stay within half a step of the float32 ones, every
precision loads and replies through the app's loader, and a bad name is refused with the list of good ones."""

from __future__ import annotations

import pytest
import torch

from tests.chat.model.test_loading import save_safetensors
from webapp.chat.decode.generate import generate
from webapp.chat.model import kernels
from webapp.chat.model import precision as precision_module
from webapp.chat.model.errors import ModelLoadError
from webapp.chat.model.linear import Linear
from webapp.chat.model.loading import load_chat_model
from webapp.chat.model.precision import PrecisionError, WeightOnlyLinear, apply_precision, parse_precision


@pytest.mark.parametrize("decode", [False, True])
def test_int8_weights_are_the_float_weights_within_half_a_step_of_their_row(decode):
    torch.manual_seed(0)
    linear = Linear(64, 96)
    linear.weight.data[3] *= 100  # one row far larger than the others: its own scale, the others keep theirs
    q = WeightOnlyLinear(linear, "int8")
    dequantized = q.weight.float() * q.scale[:, None]
    assert q.weight.dtype == torch.int8 and q.weight.shape == (96, 64)
    assert torch.equal(q.scale, linear.weight.abs().amax(dim=1) / 127)
    assert ((dequantized - linear.weight).abs() <= q.scale[:, None] / 2 * (1 + 1e-6)).all()
    x = torch.randn(5, 64)
    with torch.inference_mode():  # decode: the kernel, int8 by int8; prefill: dequantized blocks, oneDNN
        y = q(x, decode=decode)
    assert y.dtype == torch.float32
    assert torch.allclose(y, x @ dequantized.T + linear.bias, rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("precision, weights", [("float32", torch.float32), ("bfloat16", torch.bfloat16),
                                                ("int8", torch.int8)])
def test_each_precision_loads_and_replies(tmp_path, precision, weights):
    path, original = save_safetensors(tmp_path / "m")
    loaded = load_chat_model(str(path), dtype=precision)
    model = loaded.model
    assert model.transformer.h[0].mlp.c_fc.weight.dtype == weights and model.lm_head.weight.dtype == weights
    assert precision in loaded.description and f"{original.num_params() / 1e6:.1f}M params" in loaded.description
    # on the CPU only what is stored changes: weights, and keys and values in 16 bits below float32
    assert model.new_cache().k[0].dtype == (torch.float32 if precision == "float32" else torch.bfloat16)
    reply = [p.token for p in generate(loaded, [256, 65, 66, 67], max_new_tokens=12, temperature=0)]
    ids = torch.tensor([[256, 65, 66, 67]])
    with torch.inference_mode():
        first = original(ids)[0][0, -1].argmax().item()
    assert reply[0] == first  # a tiny model's clear first choice survives every precision
    assert len([t for t in reply if t is not None]) == 12


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_fewer_bytes_untie_the_head_and_keep_the_embedding_for_lookups(tmp_path, precision):
    path, _ = save_safetensors(tmp_path / "m")
    model = load_chat_model(str(path), dtype=precision).model
    assert isinstance(model.lm_head, WeightOnlyLinear)
    assert model.transformer.wte.weight.dtype == torch.float32


def test_a_bad_precision_names_the_good_ones(tmp_path):
    path, _ = save_safetensors(tmp_path / "m")
    with pytest.raises(ModelLoadError, match="unknown dtype 'int4'.*int8"):
        load_chat_model(str(path), dtype="int4")
    with pytest.raises(PrecisionError, match="CPU only"):
        parse_precision("int8", torch.device("cuda"))
    assert parse_precision("", torch.device("cpu")) == "float32"
    assert parse_precision("BF16", torch.device("cpu")) == "bfloat16"
    with pytest.raises(PrecisionError):
        apply_precision(torch.nn.Linear(2, 2), "int4")


def test_int8_prefill_takes_widths_torchs_int8_kernel_cannot():
    torch.manual_seed(7)
    linear = Linear(40, 24)  # torch's _weight_int8pack_mm crashes when in_features is not a multiple of 16
    q = WeightOnlyLinear(linear, "int8")
    x = torch.randn(5, 40)
    with torch.inference_mode():
        y = q(x)
    assert torch.allclose(y, x @ (q.weight.float() * q.scale[:, None]).T + linear.bias, rtol=2e-2, atol=5e-2)


def int8_layer(seed: int, k: int = 64, n: int = 23) -> tuple[WeightOnlyLinear, torch.Tensor]:
    """An int8 layer and its dequantized weights, written out by hand: W_q * scale, (n, k) float32."""
    torch.manual_seed(seed)
    q = WeightOnlyLinear(Linear(k, n), "int8")
    return q, q.weight.float() * q.scale[:, None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_prefill_is_the_dequantized_matmul(monkeypatch, dtype):
    """Many rows (prefill, Inside, patching) multiply by the dequantized weights, a block of output rows at a
    time: float32 where oneDNN has no bfloat16 inner product (within float32's rounding of the plain
    product), bfloat16 weights and inputs where it has one (within bfloat16's rounding)."""
    monkeypatch.setattr(precision_module, "DEQUANTIZE_BLOCK", 64 * 5)  # 5 output rows a block: 23 = 4 × 5 + 3
    monkeypatch.setattr(precision_module, "int8_dtype", lambda: dtype)
    q, dequantized = int8_layer(3)
    x = torch.randn(2, 7, 64)
    with torch.inference_mode():
        y = q(x)
    want = x @ dequantized.T + q.bias
    assert y.shape == (2, 7, 23) and y.dtype == torch.float32
    if dtype == torch.float32:
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    else:  # both factors rounded to bfloat16 (8 bits), the sums in float32, the product rounded to bfloat16
        wide = (x.bfloat16().float() @ dequantized.bfloat16().float().T).bfloat16().float() + q.bias
        torch.testing.assert_close(y, wide, rtol=8e-3, atol=1e-3)
        torch.testing.assert_close(y, want, rtol=2e-2, atol=3e-2)
    assert not torch.allclose(y, x @ q.weight.float().T + q.bias, rtol=1e-2, atol=1e-2)  # the scales count


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_int8_rows_product_does_not_depend_on_the_other_rows(monkeypatch, dtype):
    """Bit for bit: a row's output is the same alone, among 2, 5 or 40 rows, at any place among them (the blocks
    of the weight are cut by its shape, never by the rows)."""
    monkeypatch.setattr(precision_module, "DEQUANTIZE_BLOCK", 64 * 5)
    monkeypatch.setattr(precision_module, "int8_dtype", lambda: dtype)
    q, _ = int8_layer(4)
    x = torch.randn(40, 64)
    with torch.inference_mode():
        together = q(x)
        for r in (0, 3, 17, 39):
            assert torch.equal(q(x[r:r + 1]), together[r:r + 1])
            assert torch.equal(q(x[max(0, r - 1):r + 1])[-1], together[r])
            assert torch.equal(q(torch.cat([x[r:r + 1], x[:4]]))[0], together[r])
        assert torch.equal(q(x.flip(0)), together.flip(0))


def test_int8_prefill_in_blocks_is_the_same_as_in_one(monkeypatch):
    """Cutting the weight into blocks changes nothing but how much is dequantized at once."""
    q, _ = int8_layer(5)
    x = torch.randn(9, 64)
    with torch.inference_mode():
        whole = q(x)
        monkeypatch.setattr(precision_module, "DEQUANTIZE_BLOCK", 64 * 5)
        assert torch.equal(q(x), whole)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernels_dequantization_is_torchs_bit_for_bit(dtype):
    """int8 prefill widens its weights with the decode kernel's library (one pass on every thread): the same
    bits as torch's (w * scale).to(dtype), at odd widths, scales from 1e-30 to 1e30 and rounding ties; and a
    prefill with the kernel switched off (torch's dequantization) gives the same outputs."""
    if kernels.library() is None:
        pytest.skip(f"no decode kernel here: {kernels.unavailable_reason}")
    torch.manual_seed(9)
    w = torch.randint(-127, 128, (37, 1027), dtype=torch.int8)
    scale = torch.rand(37) * torch.logspace(-30, 30, 37)
    scale[0] = 1 + 2 ** -8  # 127 * scale: a product that sits near a bfloat16 rounding tie
    fast = kernels.dequantize(w, scale, dtype)
    assert fast is not None and fast.dtype == dtype
    want = (w * scale[:, None]).to(dtype)
    assert torch.equal(fast.view(torch.int16) if dtype == torch.bfloat16 else fast.view(torch.int32),
                       want.view(torch.int16) if dtype == torch.bfloat16 else want.view(torch.int32))
    q, _ = int8_layer(6)
    x = torch.randn(9, 64)
    with torch.inference_mode():
        with_kernel = q(x)
        with kernels.disabled():
            assert torch.equal(q(x), with_kernel)


def test_an_int8_decode_step_without_the_kernel_reads_the_int8_weights():
    """Few rows and no kernel: torch's weight-only int8 matmul (bfloat16 inputs), not a dequantized copy."""
    q, dequantized = int8_layer(6, k=64, n=32)
    x = torch.randn(3, 1, 64)
    with torch.inference_mode(), kernels.disabled():
        y = q(x, decode=True)
    want = torch._weight_int8pack_mm(x.view(3, 64).bfloat16(), q.weight, q.scale.bfloat16()).float() + q.bias
    assert torch.equal(y.view(3, 32), want)
    torch.testing.assert_close(y.view(3, 32), x.view(3, 64) @ dequantized.T + q.bias, rtol=2e-2, atol=5e-2)
