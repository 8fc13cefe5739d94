"""One head's attention matrix (webapp/chat/heads/compute.py, and the report webapp/chat/heads/jobs.py
makes of it): every query row equals nanoGPT's math written out here on a tiny random GPT, from the whole
context or from a kept KV cache, and each row sums to 1 over the positions it can read."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from tests.chat.inside.test_compute import CONFIG, small_gpt, tiny_loaded
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.heads.compute import head_attention
from webapp.chat.heads.jobs import HeadRequest, head_report
from webapp.chat.model.gpt import GPT, Chunk


def reference(model: GPT, ids: list[int]) -> list[torch.Tensor]:
    """nanoGPT's forward written out with the state dict alone -> per layer the (nh, T, T) attention."""
    sd = {k: v.float() for k, v in model.state_dict().items()}
    c = model.config
    hs = c.n_embd // c.n_head
    T = len(ids)

    def ln(x, name):
        return F.layer_norm(x, (c.n_embd,), sd[f"{name}.weight"], sd.get(f"{name}.bias"), 1e-5)

    def linear(x, name):
        return x @ sd[f"{name}.weight"].T + (sd[f"{name}.bias"] if f"{name}.bias" in sd else 0)

    x = sd["transformer.wte.weight"][ids] + sd["transformer.wpe.weight"][:T]  # (T, C)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    matrices = []
    for layer in range(c.n_layer):
        p = f"transformer.h.{layer}"
        q, k, v = linear(ln(x, f"{p}.ln_1"), f"{p}.attn.c_attn").split(c.n_embd, dim=1)
        q, k, v = (t.view(T, c.n_head, hs).transpose(0, 1) for t in (q, k, v))  # (nh, T, hs)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)  # (nh, T, T)
        matrices.append(att)
        y = (att @ v).transpose(0, 1).reshape(T, c.n_embd)
        x = x + linear(y, f"{p}.attn.c_proj")
        x = x + linear(F.gelu(linear(ln(x, f"{p}.ln_2"), f"{p}.mlp.c_fc")), f"{p}.mlp.c_proj")
    return matrices


def test_every_query_row_of_every_head_is_nanogpts_softmax():
    model = small_gpt()
    ids = [int(i) for i in torch.randint(0, CONFIG.vocab_size, (37,))]
    want = reference(model, ids)
    for layer in range(CONFIG.n_layer):
        for head in range(CONFIG.n_head):
            got = head_attention(model, torch.tensor([ids]), layer, head, first=20)
            assert got.shape == (17, 37) and got.dtype == torch.float32
            torch.testing.assert_close(got, want[layer][head, 20:], atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(got.sum(-1), torch.ones(17))
            assert bool((got.triu(diagonal=21) == 0).all())  # row r (position 20 + r) reads nothing after it


def test_the_job_report_equals_the_reference_with_and_without_a_kept_cache():
    model = small_gpt(1)
    loaded = tiny_loaded(model)
    ids = [int(i) for i in torch.randint(0, CONFIG.vocab_size, (30,))]
    want = reference(model, ids)[1][3, 12:]  # block 1, head 3 (both from 0), queries 12..29
    request = HeadRequest(tuple(ids), 18, 1, 3, 12)
    prefix = PrefixCache()
    cold = head_report(loaded, request, prefix=prefix)
    assert cold.reused_positions == 0
    torch.testing.assert_close(torch.tensor(cold.weights), want, atol=1e-6, rtol=1e-5)
    for kept in (25, 10):  # past the first query row (only 12 reused), and before it
        cache = model.new_cache()
        with torch.inference_mode():
            model.prefill([Chunk(ids[:kept], cache, 0, logits=False)])
        prefix = PrefixCache()
        prefix.put(cache, ids[:kept], model)
        warm = head_report(loaded, request, prefix=prefix)
        assert warm.reused_positions == min(kept, 12)
        torch.testing.assert_close(torch.tensor(warm.weights), want, atol=1e-5, rtol=1e-4)


def test_query_rows_outside_the_positions_run_are_refused():
    model = small_gpt()
    with pytest.raises(ValueError, match="query rows"):
        head_attention(model, torch.tensor([[1, 2, 3]]), 0, 0, first=3)
