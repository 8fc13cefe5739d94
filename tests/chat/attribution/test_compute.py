"""Direct logit attribution (webapp/chat/attribution/compute.py, and the job's report in
webapp/chat/attribution/jobs.py): every number equals nanoGPT's math written out here by hand on a
seed-format checkpoint loaded through the real loader, the parts add up to the logit, `against` measures
the difference, and a kept KV cache gives the same numbers."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from tests.chat.conftest import random_gpt
from webapp.chat.attribution.jobs import AttributionRequest, attribution_report
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.model.gpt import Chunk, GPTConfig
from webapp.chat.model.loading import load_chat_model

# the owner's padded GPT-2 vocabulary, 3 layers of 4 heads (the shapes do not give n_head: the arch does)
CONFIG = GPTConfig(block_size=128, vocab_size=50304, n_layer=3, n_head=4, n_embd=64)


@pytest.fixture(scope="module")
def seed_model(tmp_path_factory, gpt2_ranks):
    """A torch.compile'd model's state dict (`_orig_mod.` keys), every bias and norm off its init so each
    term of the sum shows, loaded as the app loads it."""
    model = random_gpt(CONFIG, seed=3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path_factory.mktemp("seed") / "model.pt"
    torch.save({f"_orig_mod.{k}": v for k, v in model.state_dict().items()}, path)
    return load_chat_model(str(path), arch="n_head=4", tokenizer_spec=f"gpt2:{gpt2_ranks}")


# -- nanoGPT's forward, written out, each part kept by hand: nothing of webapp's ----------------------
def reference(state: dict, ids: list[int], token: int, against: int | None = None,
              config: GPTConfig = CONFIG) -> dict:
    """-> {"logit", "embed", "heads" (L, nh), "mlps" (L,), "biases", "logits" (V,)} at the last position."""
    sd = {k.removeprefix("_orig_mod."): v.float() for k, v in state.items()}
    C, nh, L = config.n_embd, config.n_head, config.n_layer
    hs, T = C // nh, len(ids)

    def ln(x, name):
        return F.layer_norm(x, (C,), sd[f"{name}.weight"], sd[f"{name}.bias"], 1e-5)

    def linear(x, name):
        return x @ sd[f"{name}.weight"].T + sd[f"{name}.bias"]

    x = sd["transformer.wte.weight"][ids] + sd["transformer.wpe.weight"][:T]  # (T, C)
    embed, heads, mlps, bias_sum = x[-1].clone(), torch.zeros(L, nh, C), torch.zeros(L, C), torch.zeros(C)
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for layer in range(L):
        p = f"transformer.h.{layer}"
        q, k, v = linear(ln(x, f"{p}.ln_1"), f"{p}.attn.c_attn").split(C, dim=1)
        q, k, v = (t.view(T, nh, hs).transpose(0, 1) for t in (q, k, v))  # (nh, T, hs)
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(hs)).masked_fill(~causal, float("-inf")).softmax(-1)
        y = att @ v  # (nh, T, hs)
        w_o = sd[f"{p}.attn.c_proj.weight"]  # (C, C): head h reads columns h·hs .. (h+1)·hs - 1
        for h in range(nh):
            heads[layer, h] = w_o[:, h * hs:(h + 1) * hs] @ y[h, -1]
        x = x + linear(y.transpose(0, 1).reshape(T, C), f"{p}.attn.c_proj")
        out = linear(F.gelu(linear(ln(x, f"{p}.ln_2"), f"{p}.mlp.c_fc")), f"{p}.mlp.c_proj")
        mlps[layer] = out[-1] - sd[f"{p}.mlp.c_proj.bias"]
        bias_sum += sd[f"{p}.attn.c_proj.bias"] + sd[f"{p}.mlp.c_proj.bias"]
        x = x + out
    final = x[-1]
    sigma = torch.sqrt(((final - final.mean()) ** 2).mean() + 1e-5)
    gamma, beta, w_u = sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"], sd["lm_head.weight"]
    u = w_u[token] - (w_u[against] if against is not None else 0)

    def read(part):  # the part through ln_f with the scale frozen, onto the unembedding direction
        return float(((part - part.mean()) / sigma * gamma) @ u)

    logits = ln(final, "transformer.ln_f") @ w_u.T  # (V,)
    return {"logit": float(logits[token] - (logits[against] if against is not None else 0)),
            "embed": read(embed),
            "heads": torch.tensor([[read(heads[l_, h]) for h in range(nh)] for l_ in range(L)]),
            "mlps": torch.tensor([read(mlps[l_]) for l_ in range(L)]),
            "biases": read(bias_sum) + float(beta @ u), "logits": logits}


def context(n: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return [int(i) for i in torch.randint(0, 50257, (n,), generator=generator)]


def assert_matches(attribution, want):
    assert attribution.logit == pytest.approx(want["logit"], rel=1e-4, abs=1e-4)
    assert attribution.embed == pytest.approx(want["embed"], rel=1e-4, abs=1e-4)
    torch.testing.assert_close(attribution.heads, want["heads"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(attribution.mlps, want["mlps"], rtol=1e-4, atol=1e-4)
    assert attribution.biases == pytest.approx(want["biases"], rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("against", [None, 50256])
def test_every_part_is_nanogpts_math_and_the_parts_add_up_to_the_logit(seed_model, against):
    ids = context(40)
    token = 464
    report = attribution_report(seed_model, AttributionRequest(tuple(ids), token, 0, against))
    want = reference(seed_model.model.state_dict(), ids, token, against)
    a = report.attribution
    assert a.heads.shape == (CONFIG.n_layer, CONFIG.n_head) and a.mlps.shape == (CONFIG.n_layer,)
    assert_matches(a, want)
    assert a.total() == pytest.approx(a.logit, rel=1e-3)  # the contract, at float32
    assert abs(a.total() - a.logit) <= 1e-4 * max(1.0, abs(a.logit))  # and in fact far closer
    # every kind of part carries some of the logit on this model (a sum that hid one would still add up)
    assert min(abs(a.embed), abs(a.biases), float(a.heads.abs().min()), float(a.mlps.abs().min())) > 1e-4


def test_against_is_the_difference_of_the_two_tokens_splits(seed_model):
    ids, token, other = context(25, seed=1), 318, 2068
    request = AttributionRequest(tuple(ids), token, 3)
    alone = attribution_report(seed_model, request).attribution
    versus = attribution_report(seed_model, AttributionRequest(tuple(ids), other, 3)).attribution
    difference = attribution_report(seed_model, AttributionRequest(tuple(ids), token, 3, other)).attribution
    want = reference(seed_model.model.state_dict(), ids, token)["logits"]
    assert alone.logit == pytest.approx(float(want[token]), rel=1e-4)
    assert difference.logit == pytest.approx(float(want[token] - want[other]), rel=1e-4, abs=1e-4)
    torch.testing.assert_close(difference.heads, alone.heads - versus.heads, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(difference.mlps, alone.mlps - versus.mlps, rtol=1e-4, atol=1e-4)
    assert difference.embed == pytest.approx(alone.embed - versus.embed, rel=1e-4, abs=1e-4)
    assert difference.biases == pytest.approx(alone.biases - versus.biases, rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("kept", [35, 12])  # the last 5 positions run in place; the last 28 after a copy
def test_a_kept_kv_cache_gives_the_same_split_as_the_whole_context(seed_model, kept):
    ids, token = context(40, seed=2), 1110
    model = seed_model.model
    prefix = PrefixCache()
    cache = model.new_cache()
    with torch.inference_mode():
        model.prefill([Chunk(ids[:kept], cache, 0, logits=False)])
    prefix.put(cache, ids[:kept], model)
    warm = attribution_report(seed_model, AttributionRequest(tuple(ids), token, 0, 13), prefix=prefix)
    assert warm.reused_positions == kept
    assert_matches(warm.attribution, reference(model.state_dict(), ids, token, 13))
    assert prefix.peek(ids, model)[1] == kept  # read, not taken


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_at_a_reduced_precision_the_parts_still_add_up_to_its_logit(tmp_path, gpt2_ranks, dtype):
    model = random_gpt(CONFIG, seed=4)
    path = tmp_path / "model.pt"
    torch.save({f"_orig_mod.{k}": v for k, v in model.state_dict().items()}, path)
    loaded = load_chat_model(str(path), arch="n_head=4", tokenizer_spec=f"gpt2:{gpt2_ranks}", dtype=dtype)
    ids = context(30, seed=5)
    a = attribution_report(loaded, AttributionRequest(tuple(ids), 262, 0)).attribution
    want = reference(model.state_dict(), ids, 262)
    # the stored weights round; the split is still a split of the model's own logit at that precision
    assert a.total() == pytest.approx(a.logit, rel=2e-3, abs=1e-3)
    assert a.logit == pytest.approx(want["logit"], rel=2e-2, abs=2e-2)
