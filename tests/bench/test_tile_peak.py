"""bench.decode.tile_peak's harness: each way's error against double precision is the error its rounding
allows, and every way it runs reports a rate."""

from __future__ import annotations

import pytest

from bench import common
from bench.decode import tile_peak
from webapp.chat.model import kernels

FLAGS = kernels._cpu_flags().split()


@pytest.mark.skipif("avx512f" not in FLAGS or "f16c" not in FLAGS, reason="the harness is written in AVX-512")
def test_each_way_errs_as_far_as_its_rounding_allows():
    with common.native_harness(tile_peak.HARNESS, "-O3", "-lm") as binary:
        rates, errors = tile_peak.run(binary, 256, 16, 3)
    # the dot-instruction ways run where the compiler targets AVX-512 BF16 for this CPU
    dots = {"split", "rounded"} & set(rates)
    assert set(rates) - dots == {"float32", "widened"} and all(rate > 0 for rate in rates.values())
    assert set(errors) == {*rates, "float16-x"}
    # the same bfloat16 weights in both: float32 sums, within a few float32 roundings (2^-24) of the exact dot
    assert errors["float32"] == errors["widened"] and errors["widened"][1] < 2 ** -20
    # x rounded to float16 (11 bits) errs by at most 2^-11 of Σ|x w|, and more than float32 sums do
    assert errors["widened"][1] < errors["float16-x"][1] < 2 ** -11
    if dots:  # x as hi + lo keeps ~16 bits; rounded to bfloat16, 8 (2^-8 of each product at most)
        assert errors["widened"][1] < errors["split"][1] < 2 ** -15
        assert errors["float16-x"][1] < errors["rounded"][1] < 2 ** -8


def test_it_says_so_without_avx512(monkeypatch, capsys):
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: "flags : fpu sse2 avx2")
    assert tile_peak.main(["--no-doc"]) == 1
    assert "needs AVX-512" in capsys.readouterr().out
