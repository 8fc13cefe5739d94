"""Activation patching (webapp/chat/patching/compute.py) against nanoGPT's math written out here, every cell
patched by hand in a whole forward of its own: on a seed-format checkpoint (the owner's torch.save of a
compiled model) and on a small random GPT with its biases and norms off their init."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from webapp.chat.model.gpt import GPT, GPTConfig
from webapp.chat.model.loading import load_chat_model
from webapp.chat.patching.compute import patch, plan


# -- nanoGPT's forward, written out, with one activation replaced by hand ------------------------------
def reference(model, ids: list[int], chosen: int, against: int, residual=None, head=None):
    """-> (metric, residuals (L+1, T, C) entering each block then the final one, heads (L, nh, T, hs)).
    residual: (layer, position, vector) put in place of the residual entering block `layer` (layer L:
    the final one); head: (layer, head, (T, hs) outputs) put in place of that head's output."""
    metric, residuals, heads = forward_by_hand(model, ids, chosen, against, residual, head)
    return float(metric), torch.stack(residuals).detach(), torch.stack(heads).detach()


def forward_by_hand(model, ids: list[int], chosen: int, against: int, residual=None, head=None, grads=False):
    """reference()'s forward -> (metric as a tensor, residuals [(T, C)] * (L+1), heads [(nh, T, hs)] * L);
    with `grads`, each residual and head output keeps its gradient once metric.backward() has run."""
    sd = {k: v.float() for k, v in model.state_dict().items()}
    c = model.config
    hs = c.n_embd // c.n_head
    T = len(ids)

    def ln(x, name):
        return F.layer_norm(x, (c.n_embd,), sd[f"{name}.weight"], sd.get(f"{name}.bias"), 1e-5)

    def linear(x, name):
        return x @ sd[f"{name}.weight"].T + (sd[f"{name}.bias"] if f"{name}.bias" in sd else 0)

    def patched(x, layer):
        if residual is not None and residual[0] == layer:
            x = x.clone()
            x[residual[1]] = residual[2]
        return x

    x = sd["transformer.wte.weight"][ids] + sd["transformer.wpe.weight"][:T]  # (T, C)
    if grads:
        x.requires_grad_()

    def kept(t):
        if grads:
            t.retain_grad()
        return t
    residuals, heads = [], []
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for layer in range(c.n_layer):
        x = patched(x, layer)
        residuals.append(kept(x))
        p = f"transformer.h.{layer}"
        q, k, v = linear(ln(x, f"{p}.ln_1"), f"{p}.attn.c_attn").split(c.n_embd, dim=1)
        q, k, v = (t.view(T, c.n_head, hs).transpose(0, 1) for t in (q, k, v))  # (nh, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = att @ v  # (nh, T, hs)
        if head is not None and head[0] == layer:
            y = y.clone()
            y[head[1]] = head[2]
        heads.append(kept(y))
        x = x + linear(y.transpose(0, 1).reshape(T, c.n_embd), f"{p}.attn.c_proj")
        x = x + linear(F.gelu(linear(ln(x, f"{p}.ln_2"), f"{p}.mlp.c_fc")), f"{p}.mlp.c_proj")
    x = patched(x, c.n_layer)
    residuals.append(kept(x))
    logits = ln(x[-1], "transformer.ln_f") @ sd["transformer.wte.weight"].T
    return logits[chosen] - logits[against], residuals, heads


def reference_map(model, clean_ids, corrupted_ids, chosen, against):
    c = model.config
    clean, clean_res, clean_heads = reference(model, clean_ids, chosen, against)
    corrupted, _, _ = reference(model, corrupted_ids, chosen, against)

    def norm(m):
        return (m - corrupted) / (clean - corrupted)

    T = len(clean_ids)
    residual = [[norm(reference(model, corrupted_ids, chosen, against, residual=(layer, p, clean_res[layer, p]))[0])
                 for p in range(T)] for layer in range(c.n_layer + 1)]
    heads = [[norm(reference(model, corrupted_ids, chosen, against, head=(layer, h, clean_heads[layer, h]))[0])
              for h in range(c.n_head)] for layer in range(c.n_layer)]
    return clean, corrupted, residual, heads


def check(model, clean_ids, corrupted_ids, chosen, against, batch_tokens=512):
    got = patch(model, clean_ids, corrupted_ids, chosen, against, batch_tokens=batch_tokens)
    clean, corrupted, residual, heads = reference_map(model, clean_ids, corrupted_ids, chosen, against)
    assert got.clean == pytest.approx(clean, rel=1e-4, abs=1e-4)
    assert got.corrupted == pytest.approx(corrupted, rel=1e-4, abs=1e-4)
    scale = 1e-3 * max(1.0, 1 / abs(clean - corrupted))  # a normalised value divides by the span
    assert len(got.residual) == model.config.n_layer + 1 and len(got.heads) == model.config.n_layer
    for want, row in zip(residual, got.residual):
        assert row == pytest.approx(want, abs=scale)
    for want, row in zip(heads, got.heads):
        assert row == pytest.approx(want, abs=scale)
    return got


CONFIG = GPTConfig(block_size=64, vocab_size=300, n_layer=3, n_head=4, n_embd=32)


def small_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(CONFIG).eval()
    with torch.no_grad():
        for p in model.parameters():  # biases and norms off their init, so every term shows
            p.add_(torch.randn_like(p) * 0.05)
        model.transformer.wte.weight.mul_(10)  # a metric that moves
    return model


def contexts(seed: int, T: int, changed: list[int], vocab: int) -> tuple[list[int], list[int]]:
    g = torch.Generator().manual_seed(seed)
    clean = [int(i) for i in torch.randint(0, vocab, (T,), generator=g)]
    corrupted = list(clean)
    for p in changed:
        corrupted[p] = (clean[p] + 1 + p) % vocab
    return clean, corrupted


def test_every_cell_equals_the_reference_on_a_seed_format_checkpoint(seed_checkpoint, gpt2_ranks):
    loaded = load_chat_model(str(seed_checkpoint), arch="n_head=2", tokenizer_spec=f"gpt2:{gpt2_ranks}")
    clean, corrupted = contexts(1, 10, [4, 5], 50257)
    got = check(loaded.model, clean, corrupted, chosen=11, against=3290)
    assert got.first == 4
    assert all(v == 0.0 for row in got.residual for v in row[:4])  # before the edit: nothing to restore
    assert got.residual[-1] == [0.0] * 9 + [1.0]  # the final residual: the last position alone, all of it


@pytest.mark.parametrize("batch_tokens", [1, 40, 512])  # one run per forward, a few, all of a layer
def test_batching_and_starting_late_change_no_cell(batch_tokens):
    model = small_gpt()
    clean, corrupted = contexts(2, 12, [6], CONFIG.vocab_size)
    check(model, clean, corrupted, chosen=7, against=100, batch_tokens=batch_tokens)


def test_a_change_at_the_first_position_and_several_changes():
    model = small_gpt(3)
    clean, corrupted = contexts(4, 9, [0, 3, 8], CONFIG.vocab_size)
    got = check(model, clean, corrupted, chosen=5, against=6)
    assert got.first == 0


def test_the_embeddings_at_the_changed_position_restore_it_all_when_only_one_token_differs():
    # patching the whole residual at the one changed position, entering block 0, makes the runs the same
    model = small_gpt(5)
    clean, corrupted = contexts(6, 8, [3], CONFIG.vocab_size)
    got = patch(model, clean, corrupted, 1, 2)
    assert got.residual[0][3] == pytest.approx(1.0, abs=1e-4)


def test_contexts_of_different_lengths_or_equal_ones_are_refused():
    model = small_gpt()
    with pytest.raises(ValueError, match="5 and 6 tokens"):
        plan(model, [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6], 1, 2)
    with pytest.raises(ValueError, match="the same"):
        plan(model, [1, 2, 3], [1, 2, 3], 1, 2)


def test_cells_arrive_in_batches_and_fill_every_cell_once():
    model = small_gpt()
    clean, corrupted = contexts(7, 10, [5], CONFIG.vocab_size)
    p = plan(model, clean, corrupted, 3, 4, batch_tokens=10)
    seen = {"residual": [], "heads": []}
    batches = 0
    with torch.inference_mode():
        for cells in p.batches():
            batches += 1
            seen[cells.part] += [(cells.layer, i) for i in cells.indices]
    assert sorted(seen["residual"]) == [(layer, i) for layer in range(4) for i in range(10)]
    assert sorted(seen["heads"]) == [(layer, h) for layer in range(3) for h in range(4)]
    assert batches > 3 * 2 + 1  # more than one batch per layer and part
