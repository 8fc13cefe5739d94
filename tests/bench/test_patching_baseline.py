"""bench.serving.patching's baseline (one whole forward per cell) works out the same map as Glassbox: it had
gone silently wrong once GPT.forward became the hooked run (its block hooks never fired: every residual cell 0,
the largest difference 1.3 where it had been 3.3e-5)."""

from __future__ import annotations

import pytest

from bench.serving.patching import hooks
from tests.chat.patching.test_compute import CONFIG, contexts, small_gpt
from webapp.chat.patching.compute import patch


def test_the_baseline_map_equals_glassboxs():
    model = small_gpt(6)
    clean, corrupted = contexts(16, 10, [4], CONFIG.vocab_size)
    want = patch(model, clean, corrupted, 7, 100)
    got = hooks(model, clean, corrupted, 7, 100)
    assert got["clean"] == pytest.approx(want.clean, abs=1e-4)
    for mine, theirs in zip(got["residual"] + got["heads"], want.residual + want.heads, strict=True):
        assert mine == pytest.approx(theirs, abs=1e-3)
    assert any(abs(v) > 0.05 for row in got["residual"][1:-1] for v in row)  # block residuals that move it
