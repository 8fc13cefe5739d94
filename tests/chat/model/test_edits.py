"""The edit point: a head's or an MLP's output replaced per row, the same wherever the model runs, and a row's
edit changing that row alone."""

from __future__ import annotations

import contextlib

import pytest
import torch

from webapp.chat.inside.compute import look_inside
from webapp.chat.model import kernels
from webapp.chat.model.edits import Edit, HeadEdit, MlpEdit, edit_heads, edit_mlp
from webapp.chat.model.gpt import GPT, Chunk, GPTConfig

CONFIG = GPTConfig(block_size=64, vocab_size=70, n_layer=2, n_head=4, n_embd=64)
ZERO = Edit(heads=(HeadEdit(layer=1, head=2),))


def model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(CONFIG).eval()


def prompts(n: int) -> list[list[int]]:
    return [[(7 * j + 5 * i) % 70 for j in range(4 + 5 * i)] for i in range(n)]


def prefilled(m: GPT, prompt: list[int], edit: Edit | None = None):
    cache = m.new_cache()
    m.prefill([Chunk(prompt[:-1], cache, 0, logits=False, edit=edit)])
    return cache


@torch.inference_mode()
def test_an_edited_row_in_a_batch_of_8_changes_that_row_alone(monkeypatch):
    """Row 3 with a head zeroed: the other 7 rows are bit for bit the batch without the edit (still on the
    fused block kernel), row 3 differs, and is bit for bit that row run alone with the same edit."""
    assert kernels.library() is not None, kernels.unavailable_reason
    m = model()
    rows = prompts(8)
    idx = torch.tensor([p[-1] for p in rows]).view(-1, 1)
    positions = [len(p) - 1 for p in rows]
    edits: list[Edit | None] = [None] * 8
    edits[3] = ZERO

    plain = m.decode_step(idx, [prefilled(m, p) for p in rows], positions)
    fused_rows: list[int] = []
    block = kernels.block
    monkeypatch.setattr(kernels, "block", lambda x, *a: fused_rows.append(x.size(0)) or block(x, *a))
    caches = [prefilled(m, p, e) for p, e in zip(rows, edits)]
    edited = m.decode_step(idx, caches, positions, edits)
    assert fused_rows == [7] * CONFIG.n_layer  # the 7 plain rows took the kernel; row 3 never did
    monkeypatch.setattr(kernels, "block", block)

    for r in range(8):
        if r != 3:
            assert torch.equal(edited[r], plain[r])
    assert not torch.equal(edited[3], plain[3])
    alone = m.decode_step(idx[3:4], [prefilled(m, rows[3], ZERO)], positions[3:4], [ZERO])
    assert torch.equal(alone[0], edited[3])


@torch.inference_mode()
@pytest.mark.parametrize("edit", [
    ZERO,
    Edit(heads=(HeadEdit(0, 1, torch.randn(16)),)),  # a mean: one value for every position
    Edit(heads=(HeadEdit(1, 0, torch.randn(64, 16)),), mlps=(MlpEdit(0),)),  # patched per position; an MLP zeroed
    Edit(mlps=(MlpEdit(1, torch.randn(64)),)),
])
def test_an_edit_means_the_same_in_every_forward(edit):
    """forward, a chunked prefill, the decode step and Inside's layer-by-layer run all pass the same
    edit point: their logits agree (to float rounding), and differ from the unedited model's."""
    m = model(1)
    ids = prompts(6)[5]  # 29 tokens
    x = torch.tensor([ids])
    full, _ = m(x, edit=edit)  # (1, 1, V)
    assert not torch.allclose(full, m(x)[0], atol=1e-4)

    cache = m.new_cache()
    m.prefill([Chunk(ids[:10], cache, 0, logits=False, edit=edit)])
    chunked = m.prefill([Chunk(ids[10:20], cache, 10, edit=edit), Chunk(ids[:5], m.new_cache())])[0]
    torch.testing.assert_close(chunked, m(x[:, :20], edit=edit)[0][:, -1], atol=1e-5, rtol=1e-5)
    for t in range(20, len(ids)):
        for kernel in (True, False):  # the fused kernels' per-layer path, and torch's fallback
            step_cache = cache.copy(cache.max_len, t)
            with contextlib.nullcontext() if kernel else kernels.disabled():
                step = m.decode_step(x[:, t:t + 1], [step_cache], [t], [edit])
            torch.testing.assert_close(step, m(x[:, :t + 1], edit=edit)[0][:, -1], atol=1e-5, rtol=1e-5)
        m.decode_step(x[:, t:t + 1], [cache], [t], [edit])
    inside = look_inside(m, x, edit=edit)
    lens = m.lm_head(m.transformer.ln_f(inside.residuals[-1:]))
    torch.testing.assert_close(lens, full[0], atol=1e-5, rtol=1e-5)


def test_no_edit_is_the_tensor_itself_and_keys_name_what_an_edit_does():
    y = torch.randn(2, 4, 3, 16)
    assert edit_heads(y, 0, None) is y and edit_heads(y, 0, ZERO) is y  # ZERO edits layer 1 only
    out = edit_heads(y, 1, ZERO, start=5)
    assert torch.equal(out[:, 2], torch.zeros(2, 3, 16)) and torch.equal(out[:, [0, 1, 3]], y[:, [0, 1, 3]])
    patch = torch.randn(10, 16)
    assert torch.equal(edit_heads(y, 1, Edit(heads=(HeadEdit(1, 2, patch),)), start=5)[0, 2], patch[5:8])
    with pytest.raises(ValueError, match="positions"):
        edit_heads(y, 1, Edit(heads=(HeadEdit(1, 2, patch),)), start=8)
    h = torch.randn(1, 3, 64)
    assert edit_mlp(h, 0, ZERO) is h
    assert ZERO.key == Edit(heads=(HeadEdit(1, 2),)).key
    means = [Edit(heads=(HeadEdit(1, 2, value),)) for value in (torch.zeros(16), torch.ones(16))]
    keys = {e.key for e in (ZERO, Edit(heads=(HeadEdit(1, 3),)), Edit(mlps=(MlpEdit(1),)), *means)}
    assert len(keys) == 5
