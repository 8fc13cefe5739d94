"""Test models a real gunicorn loads by name, through the app's own loaders:

    GLASSBOX_CHAT_CHECKPOINT=<dir>/model.safetensors   (written by chat_models.tiny_checkpoint)
    GLASSBOX_CHAT_FACTORY=tests.support.served_models:build_chat_model
    GLASSBOX_CHAT_ARCH=tiny:0.05         a tiny random GPT, 50 ms a step, never ends before max_new_tokens
    GLASSBOX_CHAT_ARCH=script:<hex>      the same GPT forced to say the UTF-8 text <hex>, then stop
    GLASSBOX_LOOP_MODEL=tests.support.served_models:loop_bundle
    GLASSBOX_TEST_LOOP_DELAY=0.1         seconds per loop of the scripted loop model

The slowness is a forward hook on lm_head, so the real generator, KV cache and cancellation run.
"""

from __future__ import annotations

import os
import time

from tests.support.loop_models import bundle
from webapp.chat.model.gpt import GPT, GPTConfig
from webapp.chat.model.tokenizer import ByteTokenizer

TINY = dict(block_size=512, vocab_size=264, n_layer=2, n_head=2, n_embd=32)  # = chat_models.tiny_checkpoint
SPECIALS = ByteTokenizer().special_ids
FIRST_SPECIAL = min(SPECIALS.values())


def build_chat_model(arch: str) -> GPT:
    kind, _, arg = arch.partition(":")
    model = GPT(GPTConfig(**TINY))
    if kind == "tiny":
        model.lm_head.register_forward_hook(_slow_and_endless(float(arg or 0)))
    elif kind == "script":
        _script(model, list(bytes.fromhex(arg)))
    else:
        raise ValueError(f"unknown test arch {arch!r}")
    return model


def _slow_and_endless(seconds: float):
    def hook(module, args, logits):
        time.sleep(seconds)
        logits[..., FIRST_SPECIAL:] = float("-inf")
        return logits
    return hook


def _script(model: GPT, script: list[int]) -> None:
    """Says the script, then <|assistant_end|>. A prompt ends with <|assistant_start|>: the call whose
    input ends with it is the one whose logits give the reply's first token."""
    state = {"next": 0, "last_input": None}
    start, end = SPECIALS["<|assistant_start|>"], SPECIALS["<|assistant_end|>"]

    def see_input(module, args, output):
        state["last_input"] = int(args[0][0, -1])

    def force(module, args, logits):
        if state["last_input"] == start:
            state["next"] = 0
        i = state["next"]
        state["next"] = i + 1
        forced = logits.new_full(logits.shape, float("-inf"))
        forced[..., script[i] if i < len(script) else end] = 0.0
        return forced

    model.transformer.wte.register_forward_hook(see_input)
    model.lm_head.register_forward_hook(force)


def loop_bundle():
    return bundle(delay=float(os.environ.get("GLASSBOX_TEST_LOOP_DELAY", "0")))
