"""bench.decode.op_peak: its count of a token's multiply-adds is the model's linear weights, and its harness
reports a rate for every precision (and AVX-512's ways where the CPU has them)."""

from __future__ import annotations

import pytest
import torch

from bench import common
from bench.decode import op_peak
from webapp.chat.model import kernels
from webapp.chat.model.gpt import GPT, GPTConfig

FLAGS = kernels._cpu_flags().split()


def test_a_tokens_multiply_adds_are_one_per_weight_of_every_linear_layer():
    config = GPTConfig(block_size=32, vocab_size=96, n_layer=3, n_head=2, n_embd=40)
    model = GPT(config)
    linear = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert model.lm_head.weight is model.transformer.wte.weight  # tied: counted once here, as lm_head
    assert op_peak.multiply_adds_per_token(config) == sum(w.numel() for w in linear)


@pytest.mark.skipif("avx2" not in FLAGS or "fma" not in FLAGS, reason="the harness is written in AVX2")
def test_the_harness_reports_every_precision():
    with common.native_harness(op_peak.HARNESS, "-O2") as binary:
        rates = op_peak.run(binary, 100_000)
    wide = {"float32-avx512"} if "avx512f" in FLAGS else set()  # the ways a prefill multiplies on AVX-512
    wide |= {"bfloat16-dpbf16"} if "avx512_bf16" in FLAGS else set()
    assert set(rates) == {"float32", "bfloat16", "int8"} | wide and all(rate > 0 for rate in rates.values())


def test_it_says_so_without_avx2(monkeypatch, capsys):
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: "flags : fpu sse2")
    assert op_peak.main(["--no-doc"]) == 1
    assert "needs AVX2" in capsys.readouterr().out
