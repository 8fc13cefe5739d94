"""bench.common's roofline: the bytes a decode step reads and the rate they allow, against sums done by hand on
a model small enough to count (and a GGUF file written here with known tensor sizes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench import rooflines
from webapp.chat.model.gpt import GPT, GPTConfig
from webapp.chat.model.precision import apply_precision

# one layer, n_embd 4, 10 ids, 8 positions: small enough to count every number
TINY = GPTConfig(block_size=8, vocab_size=10, n_layer=1, n_head=1, n_embd=4)


def tiny(precision: str) -> GPT:
    torch.manual_seed(0)
    return apply_precision(GPT(TINY), precision).eval()


def test_float32_bytes_by_hand():
    # wte 10×4 (lm_head's too: tied, read whole); wpe left out (one row read); ln_1, ln_2, ln_f 4+4 each;
    # c_attn 12×4 + 12; attn c_proj 4×4 + 4; c_fc 16×4 + 16; mlp c_proj 4×16 + 4
    numbers = 40 + 3 * 8 + (48 + 12) + (16 + 4) + (64 + 16) + (64 + 4)
    assert numbers == 292
    model = tiny("float32")
    assert rooflines.weight_bytes_per_token(model) == 292 * 4
    # keys and values at 5 positions: 2 × 1 layer × 4 numbers × 5 × 4 bytes
    assert rooflines.kv_element_size(model) == 4
    assert rooflines.kv_bytes(TINY, 5, 4) == 160
    assert rooflines.step_bytes(model, [5]) == 1168 + 160


def test_int8_bytes_by_hand():
    # int8 matrices (a byte a weight) with a float32 scale per output row; biases and norms float32;
    # lm_head int8 of its own (10×4 + 10 scales), so wte is read one row a step and left out; KV in bfloat16
    matrices = (48 + 12 * 4) + (16 + 4 * 4) + (64 + 16 * 4) + (64 + 4 * 4) + (40 + 10 * 4)
    vectors = (12 + 4 + 16 + 4) * 4 + 3 * 8 * 4
    model = tiny("int8")
    assert rooflines.weight_bytes_per_token(model) == matrices + vectors == 416 + 240
    assert rooflines.kv_element_size(model) == 2
    assert rooflines.step_bytes(model, [5, 7]) == 656 + 2 * 4 * 5 * 2 + 2 * 4 * 7 * 2


def test_bfloat16_bytes_by_hand():
    matrices = (48 + 16 + 64 + 64 + 40) * 2
    vectors = (12 + 4 + 16 + 4) * 4 + 3 * 8 * 4
    assert rooflines.weight_bytes_per_token(tiny("bfloat16")) == matrices + vectors == 464 + 240


def test_roofline_arithmetic():
    # the float32 model's step at 5 positions reads 1,328 bytes (above): at 1.328 GB/s a million steps a
    # second, so a measured 250,000 tok/s is a quarter of the roofline
    roof, fraction = rooflines.roofline(250_000.0, rooflines.step_bytes(tiny("float32"), [5]), 1.328)
    assert roof == pytest.approx(1e6) and fraction == pytest.approx(0.25)
    # a batched step of 4 rows makes 4 tokens for the same bytes
    roof, fraction = rooflines.roofline(2e6, 1328, 1.328, rows=4)
    assert roof == pytest.approx(4e6) and fraction == pytest.approx(0.5)


def test_mean_context():
    # after a 10-token prompt, 3 steps attend over 11, 12 and 13 positions
    assert rooflines.mean_context(10, 3) == 12


def test_gguf_bytes_are_the_stored_tensors_less_the_tables_read_a_row_at_a_time(tmp_path):
    gguf = pytest.importorskip("gguf")
    from gguf.quants import quantize

    def write(path, output: bool):
        writer = gguf.GGUFWriter(str(path), "gpt2")
        writer.add_tensor("token_embd.weight", np.zeros((10, 32), np.float32))  # 1,280 bytes
        writer.add_tensor("position_embd.weight", np.zeros((8, 32), np.float32))  # 1,024: one row read
        writer.add_tensor("blk.0.attn_norm.weight", np.zeros(32, np.float32))  # 128
        q8 = quantize(np.ones((2, 64), np.float32), gguf.GGMLQuantizationType.Q8_0)  # 4 blocks of 34 bytes
        writer.add_tensor("blk.0.ffn_up.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor("blk.0.ffn_down.weight", np.zeros((64, 2), np.float16))  # 256
        if output:
            writer.add_tensor("output.weight", np.zeros((10, 32), np.float16))  # 640
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    assert rooflines.gguf_weight_bytes(write(tmp_path / "tied.gguf", False)) == 1280 + 128 + 136 + 256
    assert rooflines.gguf_weight_bytes(write(tmp_path / "own.gguf", True)) == 128 + 136 + 256 + 640
