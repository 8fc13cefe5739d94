"""Inside a GPT at one position (webapp/chat/inside/compute.py, and the report webapp/chat/inside/jobs.py
makes of it): the residuals, the attention and the logit lens equal nanoGPT's math written out here, on a
tiny random GPT, from the whole context or from a kept KV cache."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.inside.compute import look_inside
from webapp.chat.inside.jobs import InsideRequest, inside_report
from webapp.chat.model.gpt import GPT, Chunk, GPTConfig
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.model.tokenizer import ByteTokenizer


# -- nanoGPT's forward, written out: every row of every attention matrix, nothing of webapp's -----------
def reference(model: GPT, ids: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """-> (residual at the last position after embeddings and each block, per layer the last row of the
    (nh, T, T) attention matrix, lens probabilities (L, V))."""
    sd = {k: v.float() for k, v in model.state_dict().items()}
    c = model.config
    hs = c.n_embd // c.n_head
    T = len(ids)

    def ln(x, name):
        return F.layer_norm(x, (c.n_embd,), sd[f"{name}.weight"], sd.get(f"{name}.bias"), 1e-5)

    def linear(x, name):
        return x @ sd[f"{name}.weight"].T + (sd[f"{name}.bias"] if f"{name}.bias" in sd else 0)

    x = sd["transformer.wte.weight"][ids] + sd["transformer.wpe.weight"][:T]  # (T, C)
    residuals, rows = [x[-1]], []
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for layer in range(c.n_layer):
        p = f"transformer.h.{layer}"
        q, k, v = linear(ln(x, f"{p}.ln_1"), f"{p}.attn.c_attn").split(c.n_embd, dim=1)
        q, k, v = (t.view(T, c.n_head, hs).transpose(0, 1) for t in (q, k, v))  # (nh, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)  # (nh, T, T)
        rows.append(att[:, -1, :])
        y = (att @ v).transpose(0, 1).reshape(T, c.n_embd)
        x = x + linear(y, f"{p}.attn.c_proj")
        x = x + linear(F.gelu(linear(ln(x, f"{p}.ln_2"), f"{p}.mlp.c_fc")), f"{p}.mlp.c_proj")
        residuals.append(x[-1])
    logits = ln(torch.stack(residuals), "transformer.ln_f") @ sd["transformer.wte.weight"].T
    return residuals, rows, logits.softmax(dim=-1)


CONFIG = GPTConfig(block_size=64, vocab_size=300, n_layer=3, n_head=4, n_embd=32)


def small_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(CONFIG).eval()
    with torch.no_grad():
        for p in model.parameters():  # biases and norms off their init, so every term shows
            p.add_(torch.randn_like(p) * 0.05)
    return model


def test_the_lens_and_the_attention_are_nanogpts_math_on_a_tiny_random_gpt():
    model = small_gpt()
    ids = [int(i) for i in torch.randint(0, CONFIG.vocab_size, (37,))]
    want_residuals, want_rows, want_probs = reference(model, ids)
    loaded = tiny_loaded(model)
    report = inside_report(loaded, InsideRequest(tuple(ids), ids[5], 0))
    inside = look_inside(model, torch.tensor([ids]))
    torch.testing.assert_close(inside.residuals, torch.stack(want_residuals), atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(report.attention, torch.stack(want_rows), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(report.attention.sum(-1), torch.ones(CONFIG.n_layer, CONFIG.n_head))
    assert len(report.lens) == CONFIG.n_layer + 1
    for row, probs in zip(report.lens, want_probs):
        top = probs.topk(5)
        assert [t for t, _ in row.top] == top.indices.tolist()
        assert [p for _, p in row.top] == pytest.approx(top.values.tolist(), rel=1e-4)
        assert row.chosen_probability == pytest.approx(float(probs[ids[5]]), rel=1e-4)
        assert row.chosen_rank == int((probs > probs[ids[5]]).sum()) + 1


@pytest.mark.parametrize("kept", [25, 10])  # the last 5 positions run in place; the last 20 after a copy
def test_a_kept_kv_cache_gives_the_same_lens_and_attention_as_running_the_whole_context(kept):
    model = small_gpt(1)
    loaded = tiny_loaded(model)
    ids = [int(i) for i in torch.randint(0, CONFIG.vocab_size, (30,))]
    prefix = PrefixCache()
    cold = inside_report(loaded, InsideRequest(tuple(ids), ids[0], 0), prefix=prefix)
    cache = model.new_cache()
    with torch.inference_mode():
        model.prefill([Chunk(ids[:kept], cache, 0, logits=False)])
    prefix.put(cache, ids[:kept], model)
    warm = inside_report(loaded, InsideRequest(tuple(ids), ids[0], 0), prefix=prefix)
    assert (cold.reused_positions, warm.reused_positions) == (0, kept)
    torch.testing.assert_close(warm.attention, cold.attention, atol=1e-6, rtol=1e-5)
    for a, b in zip(warm.lens, cold.lens):
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        assert a.chosen_probability == pytest.approx(b.chosen_probability, rel=1e-4)
    assert prefix.peek(ids, model)[1] == kept  # read, not taken


def tiny_loaded(model) -> LoadedChatModel:
    return LoadedChatModel(model=model, tokenizer=ByteTokenizer(), block_size=model.config.block_size,
                           supports_kv_cache=True, checkpoint_id="t", description="t", prompt=None)  # type: ignore[arg-type]


