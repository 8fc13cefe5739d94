"""Fixtures for the chat model path: GPT-2's ranks file and tiny random GPTs in every checkpoint format."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from webapp.chat.model.gpt import GPT, GPTConfig
from webapp.chat.model.tokenizer import GPT2_RANKS  # packaged with webapp.chat: present on every clone

# Small, but with the owner's padded GPT-2 vocabulary. Shapes do not show n_head: loading it needs n_head=2.
SEED_LIKE = GPTConfig(block_size=128, vocab_size=50304, n_layer=2, n_head=2, n_embd=128)


@pytest.fixture(scope="session")
def gpt2_ranks() -> Path:
    return GPT2_RANKS


@pytest.fixture(scope="session")
def gpt2_tok(gpt2_ranks):
    from webapp.chat.model.tokenizer import gpt2_tokenizer
    return gpt2_tokenizer(str(gpt2_ranks))


def random_gpt(config: GPTConfig = SEED_LIKE, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(config)
    with torch.no_grad():  # larger logits than the init's, so greedy decoding has no near-ties
        model.transformer.wte.weight.mul_(10)
    return model.eval()


@pytest.fixture(scope="session")
def seed_checkpoint(tmp_path_factory) -> Path:
    """The owner's format: torch.save of a torch.compile'd model's state dict (`_orig_mod.` keys)."""
    path = tmp_path_factory.mktemp("seed") / "model.pt"
    torch.save({f"_orig_mod.{k}": v for k, v in random_gpt().state_dict().items()}, path)
    return path
