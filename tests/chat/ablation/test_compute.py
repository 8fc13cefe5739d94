"""Switching parts off (webapp/chat/ablation/compute.py) against an independent reference: nanoGPT's math
written out here in plain PyTorch from the state dict, with the heads and MLPs zeroed or mean-ablated by hand.
Also: the parts a request names, and the record and label a version keeps."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch.nn import functional as F

from tests.chat.decode.test_generate import NO_SPECIALS
from webapp.chat.ablation.compute import Parts, clean_run, intervention, parse_parts, zero_edit
from webapp.chat.decode.generate import generate
from webapp.chat.interventions import describe
from webapp.chat.model.gpt import GPT, GPTConfig
from webapp.chat.model.loading import LoadedChatModel
from webapp.chat.model.tokenizer import ByteTokenizer

SPECIALS = 256  # the byte tokenizer's specials start here; listening() never samples them
CONFIG = GPTConfig(block_size=64, vocab_size=264, n_layer=2, n_head=2, n_embd=32)


def listening_gpt(config: GPTConfig = CONFIG, seed: int = 3) -> GPT:
    """A random GPT whose heads and MLPs matter: larger weights than GPT-2's init (where the embeddings
    alone decide, and every greedy reply repeats one token), and logits far apart (no near-ties)."""
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
                p.mul_(10)
        model.lm_head.weight.mul_(5)
    return model


def listening(config: GPTConfig = CONFIG) -> LoadedChatModel:
    model = listening_gpt(config)
    model.lm_head.register_forward_hook(NO_SPECIALS)
    return LoadedChatModel(model=model, tokenizer=ByteTokenizer(), block_size=config.block_size,
                           supports_kv_cache=True, checkpoint_id="t", description="t", prompt=None)


# -- the reference ---------------------------------------------------------------------------------------
def reference(state: dict, n_head: int, ids: list[int], heads: dict | None = None, mlps: dict | None = None,
              seen: dict | None = None) -> torch.Tensor:
    """The last position's logits of nanoGPT's forward over ids, in float64. heads {(layer, head): None for
    zeros, or a (hs,) value}, mlps {layer: None or (C,)}: replaced at every position. seen: filled with every
    head's output (nh, T, hs) and every MLP's output (T, C) per layer, before any replacement."""
    heads, mlps = heads or {}, mlps or {}
    w = {k: v.double() for k, v in state.items()}
    T = len(ids)
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][:T]  # (T, C)
    C = x.size(1)
    hs = C // n_head
    n_layer = 1 + max(int(k.split(".")[2]) for k in w if k.startswith("transformer.h."))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for layer in range(n_layer):
        p = f"transformer.h.{layer}."
        a = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"])
        q, k, v = (a @ w[p + "attn.c_attn.weight"].T + w[p + "attn.c_attn.bias"]).split(C, dim=1)
        q, k, v = (t.view(T, n_head, hs).transpose(0, 1) for t in (q, k, v))  # (nh, T, hs)
        att = (q @ k.transpose(1, 2)) / math.sqrt(hs)
        y = att.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v  # (nh, T, hs)
        if seen is not None:
            seen[("heads", layer)] = y.clone()
        for (at, h), value in heads.items():
            if at == layer:
                y[h] = 0.0 if value is None else value.double()
        x = x + y.transpose(0, 1).reshape(T, C) @ w[p + "attn.c_proj.weight"].T + w[p + "attn.c_proj.bias"]
        m = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"])
        m = F.gelu(m @ w[p + "mlp.c_fc.weight"].T + w[p + "mlp.c_fc.bias"])
        m = m @ w[p + "mlp.c_proj.weight"].T + w[p + "mlp.c_proj.bias"]
        if seen is not None:
            seen[("mlp", layer)] = m.clone()
        if layer in mlps:
            m = torch.zeros_like(m) if mlps[layer] is None else mlps[layer].double().expand_as(m)
        x = x + m
    x = F.layer_norm(x, (C,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"])
    return x[-1] @ w["transformer.wte.weight"].T  # (V,)


def reference_greedy(state: dict, n_head: int, prompt: list[int], n: int, specials: int = SPECIALS,
                     **edits) -> list[int]:
    """n greedy tokens, never a special (ids from `specials` on: the models here mask them)."""
    ids = list(prompt)
    for _ in range(n):
        logits = reference(state, n_head, ids, **edits)
        logits[specials:] = float("-inf")
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]


def reference_means(state: dict, n_head: int, ids: list[int]) -> dict:
    seen: dict = {}
    reference(state, n_head, ids, seen=seen)
    return seen


def product_greedy(loaded, prompt: list[int], n: int, edit) -> list[int]:
    return [p.token for p in generate(loaded, prompt, max_new_tokens=n, temperature=0.0, edit=edit)
            if p.token is not None]


PROMPT = [(7 * j + 3) % 256 for j in range(12)]


# -- replies with parts switched off ---------------------------------------------------------------------
def test_a_reply_with_heads_zeroed_is_the_references_greedy_reply_with_those_heads_zeroed():
    loaded = listening()
    state, n_head = loaded.model.state_dict(), loaded.model.config.n_head
    parts = parse_parts("1.0, 0.1", None, None, "zero", 2, 2)
    ablated = product_greedy(loaded, PROMPT, 12, zero_edit(parts, n_head))
    expected = reference_greedy(state, n_head, PROMPT, 12, heads={(1, 0): None, (0, 1): None})
    assert ablated == expected
    assert expected != reference_greedy(state, n_head, PROMPT, 12)  # switching them off changed the reply
    assert product_greedy(loaded, PROMPT, 12, None) == reference_greedy(state, n_head, PROMPT, 12)


def test_a_whole_attention_layer_and_an_mlp_zeroed():
    loaded = listening()
    state, n_head = loaded.model.state_dict(), loaded.model.config.n_head
    parts = parse_parts("", "0", "1", "zero", 2, 2)
    assert parts.all_heads(n_head) == ((0, 0), (0, 1))
    expected = reference_greedy(state, n_head, PROMPT, 10, heads={(0, 0): None, (0, 1): None}, mlps={1: None})
    assert product_greedy(loaded, PROMPT, 10, zero_edit(parts, n_head)) == expected
    assert expected != reference_greedy(state, n_head, PROMPT, 10)


def test_mean_ablation_replaces_each_part_by_its_mean_over_the_prompts_positions():
    loaded = listening()
    state, n_head = loaded.model.state_dict(), loaded.model.config.n_head
    parts = parse_parts(["1.1"], None, [0], "mean", 2, 2)
    run = clean_run(loaded.model, PROMPT, parts)
    seen = reference_means(state, n_head, PROMPT)
    head_mean = seen[("heads", 1)][1].mean(dim=0)  # (hs,): head 1 of layer 1, averaged over the 12 positions
    mlp_mean = seen[("mlp", 0)].mean(dim=0)  # (C,)
    assert torch.allclose(run.heads[(1, 1)].double(), head_mean, atol=1e-5)
    assert torch.allclose(run.mlps[0].double(), mlp_mean, atol=1e-5)
    expected_logits = reference(state, n_head, PROMPT)[:SPECIALS]  # the specials are masked by the model's hook
    assert torch.allclose(run.logits[:SPECIALS].double(), expected_logits, rtol=1e-4, atol=1e-4)
    expected = reference_greedy(state, n_head, PROMPT, 12, heads={(1, 1): head_mean}, mlps={0: mlp_mean})
    assert product_greedy(loaded, PROMPT, 12, run.mean_edit()) == expected
    assert expected != reference_greedy(state, n_head, PROMPT, 12, heads={(1, 1): None}, mlps={0: None})


# -- what a request names ---------------------------------------------------------------------------------
def test_parts_from_a_form_or_a_json_body():
    assert parse_parts("1.0,2.3", "", "1", "zero", 4, 4) == Parts(((1, 0), (2, 3)), (), (1,), "zero")
    assert parse_parts(["1.0", "2.3"], [0], [1, 2], "mean", 4, 4) == Parts(((1, 0), (2, 3)), (0,), (1, 2), "mean")
    assert parse_parts(" 1.0 , 1.0 ", None, None, None, 4, 4) == Parts(((1, 0),), (), (), "zero")  # once; zero
    assert parse_parts("1.0 2.3", "", "1 2", "zero", 4, 4) == Parts(((1, 0), (2, 3)), (), (1, 2), "zero")


@pytest.mark.parametrize("heads, layers, mlps, mode, named", [
    ("4.0", None, None, "zero", "There is no head 4.0"),
    ("1.4", None, None, "zero", "There is no head 1.4"),
    ("1.0,x", None, None, "zero", "'x' is not a head"),
    ("1", None, None, "zero", "'1' is not a head"),
    ("-1.0", None, None, "zero", "There is no head -1.0"),
    (None, "7", None, "zero", "There is no attention layer 7"),
    (None, None, "4", "zero", "There is no MLP 4"),
    (None, None, "one", "zero", "'one' is not a layer number (in mlps)"),
    ("1.0", None, None, "half", "mode must be zero or mean"),
    ("", "", "", "zero", "Choose what to switch off"),
    ({"a": 1}, None, None, "zero", "heads must be"),
    ([1.0], None, None, "zero", 'heads must be a comma-separated string or a list of strings "layer.head"'),
    (None, None, [0.5], "zero", "mlps must be a comma-separated string or a list of layer numbers"),
])
def test_a_bad_part_is_named(heads, layers, mlps, mode, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        parse_parts(heads, layers, mlps, mode, 4, 4)


def test_the_record_and_the_label():
    parts = parse_parts("1.0,2.3", None, "1", "zero", 4, 4)
    assert intervention(parts, 4) == {"heads": ["1.0", "2.3"], "mlps": [1], "mode": "zero"}
    assert describe(intervention(parts, 4)) == "heads 1.0, 2.3 and MLP 1 zeroed"
    assert describe(intervention(parse_parts("1.0", None, None, "mean", 4, 4), 4)) == "head 1.0 mean-ablated"
    whole = intervention(parse_parts("3.1", "0", None, "zero", 4, 2), 2)
    assert whole == {"heads": ["0.0", "0.1", "3.1"], "mlps": [], "mode": "zero", "layers": [0]}
    assert describe(whole) == "attention layer 0 and head 3.1 zeroed"
