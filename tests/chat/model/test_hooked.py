"""The one hooked forward every experiment reads (webapp/chat/model/hooked.py): each hook point equals
nanoGPT's math written out here by hand, at the positions and layers asked for only; the additive edit
(a vector after block L, what steering adds) means the same in the hooked forward, prefill and the batched
decode step; and no module but the hooked forward and the serving paths loops over the blocks."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from webapp.chat.model import hooked, kernels
from webapp.chat.model.edits import Edit, HeadEdit, ResidAdd
from webapp.chat.model.gpt import GPT, Chunk, GPTConfig

CONFIG = GPTConfig(block_size=64, vocab_size=70, n_layer=3, n_head=4, n_embd=64)
ROOT = Path(__file__).resolve().parents[3]


def model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(CONFIG).eval()


def by_hand(m: GPT, ids: list[int], add: tuple[int, torch.Tensor] | None = None) -> dict[str, list[torch.Tensor]]:
    """nanoGPT's forward written out from the state dict: every hook point at every position."""
    sd = {k: v.float() for k, v in m.state_dict().items()}
    c, T = m.config, len(ids)
    hs = c.n_embd // c.n_head

    def ln(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (c.n_embd,), sd[f"{name}.weight"], sd[f"{name}.bias"], 1e-5)

    def linear(x: torch.Tensor, name: str) -> torch.Tensor:
        return x @ sd[f"{name}.weight"].T + sd[f"{name}.bias"]

    x = sd["transformer.wte.weight"][ids] + sd["transformer.wpe.weight"][:T]  # (T, C)
    out: dict[str, list[torch.Tensor]] = {"resid": [x], "z": [], "mlp_out": [], "pattern": []}
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for layer in range(c.n_layer):
        p = f"transformer.h.{layer}"
        q, k, v = linear(ln(x, f"{p}.ln_1"), f"{p}.attn.c_attn").split(c.n_embd, dim=1)
        q, k, v = (t.view(T, c.n_head, hs).transpose(0, 1) for t in (q, k, v))  # (nh, T, hs)
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(hs)).masked_fill(~causal, float("-inf")).softmax(-1)
        z = att @ v  # (nh, T, hs)
        x = x + linear(z.transpose(0, 1).reshape(T, c.n_embd), f"{p}.attn.c_proj")
        mlp = linear(F.gelu(linear(ln(x, f"{p}.ln_2"), f"{p}.mlp.c_fc")), f"{p}.mlp.c_proj")
        x = x + mlp
        if add is not None and add[0] == layer:
            x = x + add[1]
        out["pattern"].append(att)
        out["z"].append(z)
        out["mlp_out"].append(mlp)
        out["resid"].append(x)
    return out


@torch.inference_mode()
def test_every_hook_point_equals_the_math_at_the_positions_and_layers_asked():
    m = model()
    ids = [(5 * i + 3) % 70 for i in range(20)]
    want = by_hand(m, ids)
    reads = hooked.Reads(resid=True, z=True, mlp_out=True, pattern=True, first=15, layers=frozenset({0, 2}))
    out = hooked.run(m, hooked.embed(m, torch.tensor([ids])), reads=reads)
    assert sorted(out.z) == sorted(out.mlp_out) == sorted(out.pattern) == [0, 2]
    assert sorted(out.resid) == [0, 2]  # the stream entering blocks 0 and 2 (the one after block 1)
    for layer in (0, 2):
        assert out.z[layer].shape == (1, 4, 5, 16)  # positions 15..19 only
        torch.testing.assert_close(out.z[layer][0], want["z"][layer][:, 15:], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(out.mlp_out[layer][0], want["mlp_out"][layer][15:], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(out.pattern[layer][0], want["pattern"][layer][:, 15:], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(out.resid[layer][0], want["resid"][layer][15:], atol=1e-5, rtol=1e-4)
    logits, _ = m(torch.tensor([ids]))
    torch.testing.assert_close(m.lm_head(m.transformer.ln_f(out.x[:, -1:])), logits)


@torch.inference_mode()
def test_a_run_from_a_kept_cache_and_from_a_middle_layer_gives_the_whole_runs_numbers():
    m = model()
    ids = torch.tensor([[(3 * i + 1) % 70 for i in range(24)]])
    whole = hooked.run(m, hooked.embed(m, ids), reads=hooked.Reads(resid=True, keys_values=True))
    past = [whole.keys_values[layer] for layer in range(CONFIG.n_layer)]
    tail = hooked.run(m, hooked.embed(m, ids[:, 16:], 16), start=16, past=past, reads=hooked.Reads(resid=True))
    for layer in range(CONFIG.n_layer + 1):
        torch.testing.assert_close(tail.resid[layer], whole.resid[layer][:, 16:], atol=1e-5, rtol=1e-5)
    # from block 1, on the stream entering it, the last block at the last position alone
    late = hooked.run(m, whole.resid[1][:, 16:], start=16, past=past, first_layer=1, last_only=True)
    assert late.x.shape == (1, 1, CONFIG.n_embd)
    torch.testing.assert_close(late.x[:, 0], whole.x[:, -1], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="keys and values"):
        hooked.run(m, hooked.embed(m, ids[:, 16:], 16), start=16)
    with pytest.raises(ValueError, match="no blocks 0..3"):
        hooked.run(m, hooked.embed(m, ids), last_layer=3)


@torch.inference_mode()
def test_an_added_vector_after_block_L_is_what_the_math_adds_in_every_path():
    m = model()
    ids = [(7 * i + 2) % 70 for i in range(18)]
    vector = torch.randn(CONFIG.n_embd, generator=torch.Generator().manual_seed(1)) * 4
    steer = Edit(adds=(ResidAdd(1, vector),))
    want = by_hand(m, ids, add=(1, vector))
    out = hooked.run(m, hooked.embed(m, torch.tensor([ids])), edits=steer, reads=hooked.Reads(resid=True))
    for layer in range(CONFIG.n_layer + 1):  # resid[2], after block 1, reads the stream with the vector in it
        torch.testing.assert_close(out.resid[layer][0], want["resid"][layer], atol=1e-5, rtol=1e-4)
    plain = hooked.run(m, hooked.embed(m, torch.tensor([ids])), reads=hooked.Reads(resid=True))
    assert torch.equal(out.resid[1], plain.resid[1])  # before the add: the model's own bits
    assert not torch.allclose(out.resid[2], plain.resid[2], atol=1e-2)

    # prefill in two chunks, then decode one token at a time: the same logits as the model's forward
    full = [m(torch.tensor([ids[:t + 1]]), edit=steer)[0][0, -1] for t in range(len(ids))]
    cache = m.new_cache()
    m.prefill([Chunk(ids[:6], cache, 0, logits=False, edit=steer)])
    (chunked,) = m.prefill([Chunk(ids[6:12], cache, 6, edit=steer)])
    assert chunked is not None
    torch.testing.assert_close(chunked[0], full[11], atol=1e-5, rtol=1e-5)
    for t in range(12, len(ids)):
        step = m.decode_step(torch.tensor([[ids[t]]]), [cache], [t], [steer])
        torch.testing.assert_close(step[0], full[t], atol=1e-5, rtol=1e-5)


def prefilled(m: GPT, prompt: list[int], edit: Edit | None) -> object:
    cache = m.new_cache()
    m.prefill([Chunk(prompt[:-1], cache, 0, logits=False, edit=edit)])
    return cache


@torch.inference_mode()
def test_a_steered_row_keeps_the_fused_kernel_and_changes_that_row_alone(monkeypatch):
    """Row 2 adds a vector after block 0, row 5 zeroes a head: every other row is bit for bit the batch
    without edits; the steered row stays on the fused block kernel and is bit for bit itself alone."""
    assert kernels.library() is not None, kernels.unavailable_reason
    m = model()
    rows = [[(7 * j + 5 * i) % 70 for j in range(4 + 3 * i)] for i in range(8)]
    idx = torch.tensor([p[-1] for p in rows]).view(-1, 1)
    positions = [len(p) - 1 for p in rows]
    steer = Edit(adds=(ResidAdd(0, torch.full((CONFIG.n_embd,), 0.5)),))
    edits: list[Edit | None] = [None] * 8
    edits[2], edits[5] = steer, Edit(heads=(HeadEdit(1, 2),))
    plain = m.decode_step(idx, [prefilled(m, p, None) for p in rows], positions)  # type: ignore[misc]
    fused_rows: list[int] = []
    block = kernels.block
    monkeypatch.setattr(kernels, "block", lambda x, *a: fused_rows.append(x.size(0)) or block(x, *a))
    edited = m.decode_step(idx, [prefilled(m, p, e) for p, e in zip(rows, edits)], positions, edits)  # type: ignore[misc]
    assert fused_rows == [7] * CONFIG.n_layer  # every row but the one that replaces a head's output
    monkeypatch.setattr(kernels, "block", block)
    for r in (0, 1, 3, 4, 6, 7):
        assert torch.equal(edited[r], plain[r])
    assert not torch.equal(edited[2], plain[2])
    alone = m.decode_step(idx[2:3], [prefilled(m, rows[2], steer)], positions[2:3], [steer])  # type: ignore[list-item]
    assert torch.equal(alone[0], edited[2])
    assert steer.key != Edit().key  # a steered run never shares a prefix cache's entries with the plain one


BLOCK_PARTS = {"ln_1", "c_attn", "c_proj", "ln_2", "mlp", "prefill", "decode"}


def test_only_the_hooked_forward_and_the_serving_paths_run_the_blocks():
    """Every call of a block's parts from outside the block's own modules (block.ln_1(...),
    block.attn.c_attn(...), block.mlp(...), block.prefill(...), ...) is in hooked.run, GPT.prefill or
    GPT.decode_step: no experiment writes a forward of its own."""
    found = set()
    for path in sorted((ROOT / "webapp" / "chat").rglob("*.py")):
        for func in ast.walk(ast.parse(path.read_text())):
            if not isinstance(func, ast.FunctionDef):
                continue
            for call in ast.walk(func):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                    continue
                receiver = ast.unparse(call.func.value)
                if call.func.attr in BLOCK_PARTS and "block" in receiver and not receiver.startswith("self"):
                    found.add(f"{path.relative_to(ROOT)}:{func.name}")
    assert found == {"webapp/chat/model/hooked.py:run", "webapp/chat/model/gpt.py:prefill",
                     "webapp/chat/model/gpt.py:decode_step"}


@torch.inference_mode()
def test_the_serving_paths_tap_the_stream_after_a_block_where_they_give_logits():
    """What a dictionary reads as a reply is sampled: prefill's taps at each chunk's last position given logits,
    the decode step's at every row, both the stream after the block as the math has it (a steering add in it)."""
    m = model()
    ids = [[(5 * i + 3) % 70 for i in range(14)], [(11 * i + 1) % 70 for i in range(9)]]
    vector = torch.randn(CONFIG.n_embd, generator=torch.Generator().manual_seed(2)) * 3
    steer = Edit(adds=(ResidAdd(0, vector),))
    want = [by_hand(m, ids[0], add=(0, vector)), by_hand(m, ids[1])]
    caches = [m.new_cache(), m.new_cache()]
    taps: dict[int, torch.Tensor | None] = {0: None, 2: None}
    m.prefill([Chunk(ids[0][:10], caches[0], 0, edit=steer), Chunk(ids[1][:4], caches[1], 0, logits=False),
               Chunk(ids[1][4:7], caches[1], 4)], taps)  # two chunks given logits: ids[0][9] and ids[1][6]
    for block in (0, 2):
        tapped = taps[block]
        assert tapped is not None and tapped.shape == (2, CONFIG.n_embd)
        torch.testing.assert_close(tapped[0], want[0]["resid"][block + 1][9], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(tapped[1], want[1]["resid"][block + 1][6], atol=1e-5, rtol=1e-4)
    m.prefill([Chunk(ids[0][10:13], caches[0], 10, edit=steer)])  # then each up to the position decoded
    m.prefill([Chunk(ids[1][7:8], caches[1], 7)])
    taps = {1: None}
    m.decode_step(torch.tensor([[ids[0][13]], [ids[1][8]]]), caches, [13, 8], [steer, None], taps)
    tapped = taps[1]
    assert tapped is not None and tapped.shape == (2, CONFIG.n_embd)
    torch.testing.assert_close(tapped[0], want[0]["resid"][2][13], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(tapped[1], want[1]["resid"][2][8], atol=1e-5, rtol=1e-4)
