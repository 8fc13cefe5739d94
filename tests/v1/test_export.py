"""`python -m webapp.chat.export hf OUT_DIR`: transformers loads the directory and gets Glassbox's logits
(fp32, 1e-4) and token ids, for the bundled byte-level model and for GPT-2's BPE; its chat template
builds the chat page's prompt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import ROOT
from webapp.chat.model.gpt import GPT, GPTConfig
from webapp.chat.model.hf import ExportError, export_hf, gpt2_state
from webapp.chat.model.loading import load_chat_model
from webapp.v1.params import chat_turns

transformers = pytest.importorskip("transformers")  # in the [test] extra: never skipped under `make test`

TEXTS = ["Hello, world!", "What is the capital of France?", "  two spaces\tand a tab\n\nand lines\r\n",
         "Ünïcödé — “quotes” 日本語 🤖", "def f(x):\n    return x ** 2  # square", "3.14159 1e-5 12345678",
         "don't won't they're", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa abababababab"]
CONVERSATION = [("system", "Be brief."), ("user", "What is the capital of France?"),
                ("assistant", "The capital of France is Paris."), ("user", "And of Italy?")]


def same_as_glassbox(loaded, out_dir) -> None:
    """transformers' tokenizer and model from out_dir against the loaded Glassbox model."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out_dir))
    for text in TEXTS:
        assert tokenizer(text)["input_ids"] == loaded.tokenizer.encode_ordinary(text), text
    turns = chat_turns(CONVERSATION)
    prompt = loaded.prompt.build(turns, 16)
    templated = tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in CONVERSATION],
                                              add_generation_prompt=True, tokenize=True)
    assert list(templated["input_ids"] if hasattr(templated, "keys") else templated) == prompt
    model = transformers.GPT2LMHeadModel.from_pretrained(str(out_dir), dtype=torch.float32).eval()
    ids = torch.tensor([prompt + loaded.tokenizer.encode_ordinary(TEXTS[3])])
    with torch.no_grad():
        ours, _ = loaded.model(ids, targets=torch.zeros_like(ids))  # targets: the logits of every position
        theirs = model(ids).logits
    assert theirs.shape == ours.shape
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)
    assert ours.abs().max() > 1  # not a trivially small pair of tensors


def test_the_bundled_byte_level_model_exports_from_the_command_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_CHAT_")}  # the bundled model
    out = tmp_path / "hf"
    run = subprocess.run([sys.executable, "-m", "webapp.chat.export", "hf", str(out)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer_config.json",
            "generation_config.json"} <= names
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert [config["added_tokens_decoder"][str(i)]["content"] for i in range(256, 261)] == [
        "<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>"]
    loaded = load_chat_model(str(ROOT / "models/chat/model.safetensors"))
    same_as_glassbox(loaded, out)
    again = subprocess.run([sys.executable, "-m", "webapp.chat.export", "hf", str(out)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "--force" in again.stderr  # never writes over a directory unasked


def test_a_gpt2_bpe_model_exports_gpt2s_own_tokenizer(tmp_path):
    torch.manual_seed(0)
    config = GPTConfig(block_size=128, vocab_size=50304, n_layer=2, n_head=2, n_embd=64)
    model = GPT(config)
    with torch.no_grad():
        model.transformer.wte.weight.mul_(10)  # logits far from zero, so 1e-4 means something
    source = tmp_path / "source"
    source.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
              str(source / "model.safetensors"))
    (source / "config.json").write_text(json.dumps({"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 128,
                                                    "vocab_size": 50304, "tokenizer": "gpt2"}))
    loaded = load_chat_model(str(source / "model.safetensors"))
    export_hf(loaded, tmp_path / "hf")
    merges = (tmp_path / "hf" / "merges.txt").read_text().splitlines()
    assert len(merges) == 1 + 50000  # the header, then GPT-2's 50,000 merges
    same_as_glassbox(loaded, tmp_path / "hf")
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert generation["eos_token_id"][0] == 50257 and generation["eos_token_id"][-1] == 50303


def test_a_model_not_in_gpt2s_layout_is_refused_with_the_reason():
    odd = torch.nn.Module()
    odd.config = SimpleNamespace(n_layer=1, n_head=1, n_embd=4, vocab_size=8, block_size=8)
    odd.proj = torch.nn.Linear(4, 4)
    with pytest.raises(ExportError, match="GPT-2's layout"):
        gpt2_state(odd)
