"""Character-level tokenizer for Loop-lab prompts (one id per character).

Call shape follows the Hugging Face tokenizers the owner's demo was written
against: `tok(text, add_special_tokens=False, return_tensors="pt")` returns a
dict of [1, T] LongTensors. Letters A..Z are ids 0..25, so the readout ids are
simply 0..25; there are no special tokens (every prompt has the same length).
"""

import numpy as np
import torch

from webapp.loops.task import SYMBOLS

DIGITS = "0123456789"
VOCAB = tuple(SYMBOLS) + tuple(DIGITS) + (" ", ";", "=", "s", "k")


class CharTokenizer:
    def __init__(self, vocab=VOCAB):
        self.vocab = tuple(vocab)
        if len(set(self.vocab)) != len(self.vocab) or any(len(c) != 1 for c in self.vocab):
            raise ValueError("Tokenizer vocab must be distinct single characters")
        self.stoi = {c: i for i, c in enumerate(self.vocab)}
        missing = [c for c in SYMBOLS + DIGITS if c not in self.stoi]
        if missing:
            raise ValueError(f"Tokenizer vocab lacks {''.join(missing)!r}")
        self.readout_token_ids = [self.stoi[c] for c in SYMBOLS]
        self.digit_token_ids = [self.stoi[c] for c in DIGITS]
        # Byte -> id lookup for fast batch encoding of ASCII prompts (-1 = unknown).
        self._table = np.full(256, -1, dtype=np.int64)
        for c, i in self.stoi.items():
            if ord(c) < 256:
                self._table[ord(c)] = i

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        unknown = sorted({c for c in text if c not in self.stoi})
        if unknown:
            raise ValueError(f"Prompt has characters outside the Loop-lab vocabulary: {unknown!r}")
        return [self.stoi[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.vocab[int(i)] for i in ids)

    def __call__(self, text: str, add_special_tokens: bool = False, return_tensors: str = "pt") -> dict:
        # There are no special tokens; the flag is accepted for call-shape compatibility.
        if return_tensors != "pt":
            raise ValueError("Only return_tensors='pt' is supported")
        ids = torch.tensor([self.encode(text)], dtype=torch.long)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def encode_batch(self, texts: list[str]) -> torch.Tensor:
        """Equal-length prompts -> [B, T] LongTensor (used by training and eval)."""
        raw = np.frombuffer("".join(texts).encode("latin-1", errors="replace"), dtype=np.uint8)
        ids = self._table[raw]
        if (ids < 0).any() or len({len(t) for t in texts}) != 1:
            return torch.tensor([self.encode(t) for t in texts], dtype=torch.long)
        return torch.from_numpy(ids.reshape(len(texts), -1).copy())
