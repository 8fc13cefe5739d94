"""`python -m webapp.chat.export gguf OUT.gguf`: read back with gguf's own reader (llama.cpp's gguf-py), the
file has llama.cpp's GPT-2 tensors with Glassbox's weights (f32 exact, f16 and q8_0 within their rounding),
the vocabulary (the byte-level one with its never-applying merge, GPT-2's BPE with its 50,000 merges), the
chat specials as CONTROL tokens and the chat template. Loading it in llama.cpp itself: bench/peers/engines.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import ROOT
from webapp.chat.model.gguf import export_gguf, gguf_tensors
from webapp.chat.model.gpt import GPT, GPTConfig
from webapp.chat.model.hf import chat_template
from webapp.chat.model.loading import load_chat_model

gguf = pytest.importorskip("gguf")  # a dependency (pyproject.toml): never skipped under `make test`


def field(reader, key):
    f = reader.fields[key]
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode() for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[-1]).decode()
    return f.parts[-1].tolist()[0]


def weights(reader) -> dict[str, np.ndarray]:
    return {t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
            for t in reader.tensors}


def test_the_bundled_byte_level_model_from_the_command_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_CHAT_")}  # the bundled model
    out = tmp_path / "chat.gguf"
    run = subprocess.run([sys.executable, "-m", "webapp.chat.export", "gguf", str(out), "--outtype", "f32"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    loaded = load_chat_model(str(ROOT / "models/chat/model.safetensors"))
    c = loaded.model.config
    reader = gguf.GGUFReader(str(out))
    assert field(reader, "general.architecture") == "gpt2"
    assert (field(reader, "gpt2.context_length"), field(reader, "gpt2.embedding_length"),
            field(reader, "gpt2.block_count"), field(reader, "gpt2.attention.head_count")) == \
        (c.block_size, c.n_embd, c.n_layer, c.n_head)
    assert field(reader, "gpt2.feed_forward_length") == 4 * c.n_embd
    assert field(reader, "tokenizer.ggml.model") == "gpt2" and field(reader, "tokenizer.ggml.pre") == "gpt-2"
    tokens, types = field(reader, "tokenizer.ggml.tokens"), field(reader, "tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == c.vocab_size
    assert tokens[ord("a")] == "a" and tokens[ord(" ")] == "Ġ" and tokens[0xC3] == "Ã"  # GPT-2's byte map
    assert tokens[256:261] == ["<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>"]
    assert types[:256] == [gguf.TokenType.NORMAL] * 256 and types[256:261] == [gguf.TokenType.CONTROL] * 5
    assert set(types[261:]) <= {gguf.TokenType.UNUSED}
    assert field(reader, "tokenizer.ggml.merges") == ["<|bos|> <|assistant_end|>"]  # present, never applies
    assert (field(reader, "tokenizer.ggml.bos_token_id"), field(reader, "tokenizer.ggml.eos_token_id"),
            field(reader, "tokenizer.ggml.eot_token_id")) == (256, 260, 257)
    assert field(reader, "tokenizer.ggml.add_bos_token") is False
    assert field(reader, "tokenizer.chat_template") == chat_template()
    got = weights(reader)
    want = gguf_tensors(loaded.model)
    assert set(got) == set(want) and "output.weight" not in got  # tied to token_embd, as GPT-2
    assert len(got) == 4 + 12 * c.n_layer
    for name, w in want.items():
        assert np.array_equal(got[name], w), name
    assert got["blk.0.attn_qkv.weight"].shape == (3 * c.n_embd, c.n_embd)  # nn.Linear's (out, in)
    sd = loaded.model.state_dict()
    assert np.array_equal(got["blk.0.ffn_down.weight"], sd["transformer.h.0.mlp.c_proj.weight"].numpy())
    again = subprocess.run([sys.executable, "-m", "webapp.chat.export", "gguf", str(out)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "--force" in again.stderr  # never writes over a file unasked


@pytest.fixture(scope="module")
def gpt2_model(tmp_path_factory):
    torch.manual_seed(0)
    source = tmp_path_factory.mktemp("gpt2-source")
    model = GPT(GPTConfig(block_size=64, vocab_size=50304, n_layer=1, n_head=2, n_embd=64))
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
              str(source / "model.safetensors"))
    (source / "config.json").write_text(json.dumps({"n_layer": 1, "n_head": 2, "n_embd": 64, "block_size": 64,
                                                    "vocab_size": 50304, "tokenizer": "gpt2"}))
    return load_chat_model(str(source / "model.safetensors"))


def test_f16_matrices_within_their_rounding(tmp_path):
    loaded = load_chat_model(str(ROOT / "models/chat/model.safetensors"))
    reader = gguf.GGUFReader(str(export_gguf(loaded, tmp_path / "m.gguf", "f16")))
    kinds = {t.name: t.tensor_type for t in reader.tensors}
    assert kinds["blk.0.attn_qkv.weight"] == kinds["token_embd.weight"] == gguf.GGMLQuantizationType.F16
    assert kinds["blk.0.attn_norm.bias"] == gguf.GGMLQuantizationType.F32  # norms and biases stay float32
    got, want = weights(reader), gguf_tensors(loaded.model)
    for name, w in want.items():
        assert np.abs(got[name] - w).max() <= 1e-3 * max(1.0, np.abs(w).max()), name


@pytest.mark.parametrize("outtype, tolerance", [("q8_0", 2e-2)])
def test_a_gpt2_bpe_model_with_its_merges_in_q8_0(gpt2_model, tmp_path, outtype, tolerance):
    out = export_gguf(gpt2_model, tmp_path / "m.gguf", outtype)
    reader = gguf.GGUFReader(str(out))
    tokens, types = field(reader, "tokenizer.ggml.tokens"), field(reader, "tokenizer.ggml.token_type")
    assert len(tokens) == 50304 and tokens[50256] == "<|endoftext|>" and tokens[50257] == "<|bos|>"
    assert types[50256] == types[50257] == gguf.TokenType.CONTROL and types[50303] == gguf.TokenType.UNUSED
    assert tokens[50303] == "[PAD50303]" and tokens[464] == "The"
    merges = field(reader, "tokenizer.ggml.merges")
    assert len(merges) == 50000 and merges[0] == "Ġ t"
    kinds = {t.name: t.tensor_type for t in reader.tensors}
    assert kinds["blk.0.attn_qkv.weight"] == kinds["token_embd.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert kinds["blk.0.attn_norm.bias"] == gguf.GGMLQuantizationType.F32  # norms and biases stay float32
    got, want = weights(reader), gguf_tensors(gpt2_model.model)
    for name, w in want.items():
        assert np.abs(got[name] - w).max() <= tolerance * max(1.0, np.abs(w).max()), name
    assert not (tmp_path / "m.gguf.part").exists()
