"""Attribution patching (webapp/chat/patching/estimate.py) against a gradient taken by hand: nanoGPT's forward
written out (test_compute.forward_by_hand), one plain PyTorch backward of the corrupted run, every cell's
first-order move (a' - a) · ∂metric/∂a worked out here; and the exact map's batches ordered by it."""

from __future__ import annotations

import pytest
import torch

from tests.chat.patching.test_compute import CONFIG, contexts, forward_by_hand, small_gpt
from webapp.chat.model.loading import load_chat_model
from webapp.chat.model.precision import apply_precision
from webapp.chat.patching.compute import patch, plan
from webapp.chat.patching.estimate import estimate


def estimate_by_hand(model, clean_ids, corrupted_ids, chosen, against):
    """-> (residual (L+1) x T, heads L x nh): each cell's first-order share of the metric restored."""
    with torch.no_grad():
        clean, clean_res, clean_heads = forward_by_hand(model, clean_ids, chosen, against)
    corrupted, res, heads = forward_by_hand(model, corrupted_ids, chosen, against, grads=True)
    corrupted.backward()
    span = float(clean) - float(corrupted.detach())
    residual = [((c - r) * r.grad).sum(-1).div(span).tolist() for c, r in zip(clean_res, res)]
    head_map = [((c - h) * h.grad).sum((-1, -2)).div(span).tolist() for c, h in zip(clean_heads, heads)]
    return residual, head_map


def check(model, clean_ids, corrupted_ids, chosen, against):
    got = estimate(model, clean_ids, corrupted_ids, chosen, against)
    residual, heads = estimate_by_hand(model, clean_ids, corrupted_ids, chosen, against)
    assert got.is_estimate
    for want, row in zip(residual, got.residual, strict=True):
        assert row == pytest.approx(want, rel=1e-4, abs=1e-4)
    for want, row in zip(heads, got.heads, strict=True):
        assert row == pytest.approx(want, rel=1e-4, abs=1e-4)
    return got


def test_every_estimated_cell_equals_a_gradient_taken_by_hand():
    model = small_gpt(1)
    clean, corrupted = contexts(11, 12, [5, 7], CONFIG.vocab_size)
    got = check(model, clean, corrupted, chosen=7, against=100)
    assert got.first == 5 and got.residual[0][:5] == [0.0] * 5  # before the edit: no difference, no move
    assert any(abs(v) > 0.05 for row in got.residual for v in row)  # a map that says something


def test_an_edit_at_the_first_position_and_a_seed_format_checkpoint(seed_checkpoint, gpt2_ranks):
    check(small_gpt(2), *contexts(12, 9, [0, 4], CONFIG.vocab_size), chosen=3, against=4)
    loaded = load_chat_model(str(seed_checkpoint), arch="n_head=2", tokenizer_spec=f"gpt2:{gpt2_ranks}")
    check(loaded.model, *contexts(1, 10, [4, 5], 50257), chosen=11, against=3290)


def test_the_final_residual_moves_the_metric_at_the_last_position_alone_as_in_the_exact_map():
    model = small_gpt(3)
    clean, corrupted = contexts(13, 8, [2], CONFIG.vocab_size)
    got = estimate(model, clean, corrupted, 5, 6)
    exact = patch(model, clean, corrupted, 5, 6)
    assert got.residual[-1][:-1] == exact.residual[-1][:-1] == [0.0] * 7
    assert got.residual[-1][-1] != 0.0  # the tangent of ln_f there, near the exact 1
    assert got.residual[-1][-1] == pytest.approx(1.0, abs=0.5)


def test_a_reduced_precision_model_takes_its_gradient_through_its_stored_weights():
    # oneDNN's inner product has no backward: bfloat16 and int8 layers widen their stored weights for it
    model = small_gpt(4)
    clean, corrupted = contexts(14, 10, [3], CONFIG.vocab_size)
    want = torch.tensor(flat(estimate(model, clean, corrupted, 7, 8)))
    for precision in ("bfloat16", "int8"):
        got = torch.tensor(flat(estimate(apply_precision(small_gpt(4), precision), clean, corrupted, 7, 8)))
        assert torch.isfinite(got).all()
        assert torch.corrcoef(torch.stack([got, want]))[0, 1] > 0.98, precision  # the same map, to rounding


def flat(patching) -> list[float]:
    return [v for rows in (patching.residual, patching.heads) for row in rows for v in row]


def test_the_exact_batches_come_largest_estimate_first_and_change_no_cell():
    model = small_gpt(5)
    clean, corrupted = contexts(15, 12, [4], CONFIG.vocab_size)
    work = plan(model, clean, corrupted, 2, 9, batch_tokens=16)
    guess = estimate(model, clean, corrupted, 2, 9)
    order = []
    ordered = work.empty()
    with torch.inference_mode():
        for cells in work.batches(first_by=guess):
            ordered.fill(cells)
            rows = guess.residual if cells.part == "residual" else guess.heads
            forwards = cells.part == "heads" or (cells.layer < CONFIG.n_layer and cells.indices[0] >= work.first)
            if forwards:  # a patched run (the others are known without one and come first)
                order.append(max(abs(rows[cells.layer][i] or 0.0) for i in cells.indices))
    assert len(order) > 6 and order == sorted(order, reverse=True)
    assert ordered.residual == patch(model, clean, corrupted, 2, 9, batch_tokens=16).residual


def test_contexts_of_different_lengths_or_equal_ones_are_refused():
    with pytest.raises(ValueError, match="5 and 6 tokens"):
        estimate(small_gpt(), [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6], 1, 2)
    with pytest.raises(ValueError, match="the same"):
        estimate(small_gpt(), [1, 2, 3], [1, 2, 3], 1, 2)
