"""A worked example of the factory hook: the owner's `build_model(arch)`, written against Glassbox's GPT.

Point the app at it with
    GLASSBOX_CHAT_FACTORY=examples/owner_chat_model.py:build_model   (or examples.owner_chat_model:build_model)
    GLASSBOX_CHAT_ARCH=gpt2-254m
    GLASSBOX_CHAT_CHECKPOINT=/path/to/model.pt
    GLASSBOX_CHAT_TOKENIZER=gpt2                     (GPT-2 BPE shipped in webapp/chat/model/data/)

The loader calls build_model(arch) exactly as the owner's server does, then loads the checkpoint
strictly. Any nn.Module works if `model(idx)` returns `(logits, loss)` and it has `config.block_size`;
without `prefill`/`new_cache` replies use the (much slower) full-recompute loop.
"""

from webapp.chat.model.gpt import GPT, PRESETS, GPTConfig

# The presets plus a tiny one for tests and quick tries (vocab padded like the owner's, 50304).
ARCHS = {**PRESETS, "owner-tiny": GPTConfig(block_size=128, vocab_size=50304, n_layer=2, n_head=2, n_embd=128)}


def build_model(arch: str) -> GPT:
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; known: {', '.join(ARCHS)}")
    return GPT(ARCHS[arch])
