"""Small real chat models for tests: the project's GPT with random weights, saved and loaded
through the real loader, byte-level tokenizer."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file

from webapp.chat.model.gpt import GPT, GPTConfig
from webapp.chat.model.loading import load_chat_model


def tiny_checkpoint(directory: Path, block_size: int = 512, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    config = GPTConfig(block_size=block_size, vocab_size=264, n_layer=2, n_head=2, n_embd=32)
    model = GPT(config)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({**asdict(config), "tokenizer": "byte"}))
    return directory / "model.safetensors"


def tiny_chat_model(directory: Path, *, block_size: int = 512, seconds_per_step: float = 0.0):
    """With seconds_per_step, a real model made slow and endless (it never samples a special
    token, so a reply runs to max_new_tokens), for testing Stop, disconnects and the queue."""
    loaded = load_chat_model(str(tiny_checkpoint(directory, block_size)))
    if seconds_per_step:
        def slow_and_endless(module, args, logits):
            time.sleep(seconds_per_step)
            logits[..., 256:] = float("-inf")
            return logits
        loaded.model.lm_head.register_forward_hook(slow_and_endless)
    return loaded
