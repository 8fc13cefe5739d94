"""Precisions (webapp/chat/precision.py): int8 weights stay close to the float32 ones, every precision
loads and replies through the app's loader, and a bad name is refused with the list of good ones."""

from __future__ import annotations

import pytest
import torch

from tests.chat.test_loading import save_safetensors
from webapp.chat.errors import ModelLoadError
from webapp.chat.generate import generate
from webapp.chat.loading import load_chat_model
from webapp.chat.model import Linear
from webapp.chat.precision import Int8Linear, PrecisionError, apply_precision, parse_precision


def test_int8_weights_are_the_float_weights_within_half_a_step_of_their_row():
    torch.manual_seed(0)
    linear = Linear(64, 96)
    linear.weight.data[3] *= 100  # one row far larger than the others: its own scale, the others keep theirs
    q = Int8Linear(linear)
    dequantized = q.weight.float() * q.scales.float()[:, None]
    step = linear.weight.abs().amax(dim=1) / 127
    assert q.weight.dtype == torch.int8 and q.weight.shape == (96, 64)
    assert ((dequantized - linear.weight).abs() <= q.scales.float()[:, None] / 2).all()  # half a step at most
    assert (q.scales.float() >= step).all() and (q.scales.float() < step * 1.01).all()
    x = torch.randn(5, 64).bfloat16()
    expected = x.float() @ dequantized.T + linear.bias
    assert torch.allclose(q(x).float(), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("precision, weights", [("float32", torch.float32), ("bfloat16", torch.bfloat16),
                                                ("int8", torch.int8)])
def test_each_precision_loads_and_replies(tmp_path, precision, weights):
    path, original = save_safetensors(tmp_path / "m")
    loaded = load_chat_model(str(path), dtype=precision)
    model = loaded.model
    assert model.transformer.h[0].mlp.c_fc.weight.dtype == weights and model.lm_head.weight.dtype == weights
    assert precision in loaded.description and f"{original.num_params() / 1e6:.1f}M params" in loaded.description
    assert model.new_cache().k[0].dtype == (torch.float32 if precision == "float32" else torch.bfloat16)
    reply = [p.token for p in generate(loaded, [256, 65, 66, 67], max_new_tokens=12, temperature=0)]
    ids = torch.tensor([[256, 65, 66, 67]])
    with torch.inference_mode():
        first = original(ids)[0][0, -1].argmax().item()
    assert reply[0] == first  # a tiny model's clear first choice survives every precision
    assert len([t for t in reply if t is not None]) == 12


def test_int8_unties_the_head_and_keeps_the_embedding_for_lookups(tmp_path):
    path, _ = save_safetensors(tmp_path / "m")
    model = load_chat_model(str(path), dtype="int8").model
    assert isinstance(model.lm_head, Int8Linear)
    assert model.transformer.wte.weight.dtype == torch.bfloat16


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
