"""Precisions (webapp/chat/model/precision.py): int8 weights stay within half a step of the float32 ones, every
precision loads and replies through the app's loader, and a bad name is refused with the list of good ones."""

from __future__ import annotations

import pytest
import torch

from tests.chat.model.test_loading import save_safetensors
from webapp.chat.decode.generate import generate
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
    with torch.inference_mode():  # decode: the kernel, int8 by int8; prefill: torch's int8 kernel in bfloat16
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
