"""The whole-reply lens's torch work: the residuals kept at the reply's positions are the ones Inside reads at
each position alone (edited too), and the output layer run a few rows at a time gives what it gives at once."""

from __future__ import annotations

import torch

from tests.chat.inside.test_compute import small_gpt
from webapp.chat.inside.compute import lens_logits, look_inside
from webapp.chat.lens.compute import lens_grid, reply_residuals
from webapp.chat.model.edits import Edit, HeadEdit, MlpEdit


def test_each_kept_residual_is_the_one_inside_reads_at_that_position_alone_with_an_edit_too():
    model = small_gpt()
    ids = torch.randint(0, 300, (1, 20), generator=torch.Generator().manual_seed(1))
    for edit in (None, Edit(heads=(HeadEdit(1, 2),), mlps=(MlpEdit(0),))):
        residuals = reply_residuals(model, ids, 12, edit=edit)  # (L, 8, C)
        assert residuals.shape == (4, 8, 32)
        for r in range(8):
            alone = look_inside(model, ids[:, :13 + r], edit=edit).residuals  # (L, C) at position 12 + r
            torch.testing.assert_close(residuals[:, r], alone, rtol=1e-5, atol=1e-5)


def test_the_output_layer_in_chunks_gives_what_it_gives_at_once():
    model = small_gpt()
    ids = torch.randint(0, 300, (1, 16), generator=torch.Generator().manual_seed(2))
    residuals = reply_residuals(model, ids, 6)  # (4, 10, C)
    written = torch.randint(0, 300, (10,), generator=torch.Generator().manual_seed(3))
    whole = lens_grid(model, residuals, written)
    calls = []
    chunked = lens_grid(model, residuals, written, between=lambda: calls.append(1), logit_floats=3 * 300)
    assert len(calls) == 14  # 40 rows, 3 at a time
    for a, b in zip((whole.top, whole.top_p, whole.written_p, whole.written_rank),
                    (chunked.top, chunked.top_p, chunked.written_p, chunked.written_rank)):
        torch.testing.assert_close(a, b)
    probs = torch.softmax(lens_logits(model, residuals.reshape(40, 32)).float(), -1).view(4, 10, 300)
    torch.testing.assert_close(whole.top_p, probs.max(-1).values)
    assert torch.equal(whole.top, probs.argmax(-1))
    mine = probs.gather(-1, written.view(1, 10, 1).expand(4, 10, 1))
    torch.testing.assert_close(whole.written_p, mine[..., 0])
    assert torch.equal(whole.written_rank, (probs > mine).sum(-1) + 1)


def test_a_kept_kv_caches_first_positions_give_the_same_residuals_as_running_everything():
    from webapp.chat.model.gpt import Chunk
    model = small_gpt()
    ids = torch.randint(0, 300, (1, 24), generator=torch.Generator().manual_seed(4))
    cache = model.new_cache()
    with torch.inference_mode():
        model.prefill([Chunk(ids[0, :20].tolist(), cache, 0, logits=False)])
    for start in (5, 14):
        past = [(k[:, :, :start], v[:, :, :start]) for k, v in zip(cache.k, cache.v)]
        reused = reply_residuals(model, ids[:, start:], 14, start=start, past=past)  # (L, 10, C)
        torch.testing.assert_close(reused, reply_residuals(model, ids, 14), rtol=1e-5, atol=1e-5)
