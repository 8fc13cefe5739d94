"""Activations to train a dictionary on: a corpus read a document at a time, made into sequences of the model's
tokens, run through the hooked forward a batch of sequences at a time (the model already loaded; nothing is
copied), the residual stream after the chosen blocks kept, shuffled in a bounded buffer. The corpus is never
held in memory.

A corpus is a text file or a folder of them (read in name order):
    *.txt     plain text, one document a line (an empty line is skipped): [bos, *encode(text)]
    *.jsonl   one chat exchange a line, {"user": ..., "assistant": ...} (or {"messages": [{"role", "content"}]}),
              wrapped as the chat template wraps turns: [bos, user turn, assistant turn, ...]
Documents are packed end to end and cut into sequences of `context` tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from webapp.chat.model import hooked

SUFFIXES = (".txt", ".jsonl")


class CorpusError(ValueError):
    """A corpus that cannot be read: the message names it and why."""


def corpus_files(path: Path) -> list[Path]:
    """The corpus's files. Raises CorpusError for a path that is missing or holds no text file."""
    if path.is_file():
        if path.suffix not in SUFFIXES:
            raise CorpusError(f"{path}: a corpus is a .txt or .jsonl file, or a folder of them")
        return [path]
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        if not found:
            raise CorpusError(f"{path}: no .txt or .jsonl file in this folder")
        return found
    raise CorpusError(f"{path}: no such file or folder")


def documents(files: Sequence[Path], prompt: Any) -> Iterator[list[int]]:
    """Each document's token ids, file by file; `prompt`: the model's PromptBuilder (its tokenizer, bos and
    turn markers). Raises CorpusError for a file that is not UTF-8 text or a malformed JSON line."""
    for path in files:
        number = 0
        try:
            with path.open(encoding="utf-8") as lines:
                for line in lines:
                    number += 1
                    if not line.strip():
                        continue
                    if path.suffix == ".txt":
                        yield [prompt.bos, *prompt.tokenizer.encode_ordinary(line.rstrip("\n"))]
                    else:
                        yield [prompt.bos, *_turns(json.loads(line), prompt)]
        except UnicodeDecodeError:
            raise CorpusError(f"{path}: not UTF-8 text") from None
        except (ValueError, KeyError, TypeError) as error:
            raise CorpusError(f"{path}, line {number}: not a chat exchange ({error})") from None


def _turns(exchange: dict[str, Any], prompt: Any) -> list[int]:
    if "messages" in exchange:
        turns = [(m["role"], m["content"]) for m in exchange["messages"]]
    else:
        turns = [("user", exchange["user"]), ("assistant", exchange["assistant"])]
    return [t for role, text in turns for t in prompt.encode_turn(role, str(text))]


def sequences(docs: Iterator[list[int]], context: int) -> Iterator[list[int]]:
    """Documents packed end to end, cut into sequences of `context` tokens (the last partial one dropped)."""
    buffer: list[int] = []
    for doc in docs:
        buffer.extend(doc)
        start = 0
        while len(buffer) - start >= context:
            yield buffer[start:start + context]
            start += context
        del buffer[:start]  # once per document: a long one costs what it holds, not its square


def activations(model: Any, seqs: Iterator[list[int]], layers: Sequence[int], batch: int,
                skip_first: int = 1) -> Iterator[tuple[dict[int, torch.Tensor], int]]:
    """Batches of sequences through the hooked forward, up to the last block asked -> ({layer: (N, C) float32
    rows}, tokens run) per batch. skip_first: positions at each sequence's start left out (the start token's
    stream is unlike any other's)."""
    device = model.transformer.wte.weight.device
    reads = hooked.Reads(resid=True, layers=frozenset(layer + 1 for layer in layers))
    while True:
        rows = [s for _, s in zip(range(batch), seqs)]
        if not rows:
            return
        ids = torch.tensor(rows, dtype=torch.long, device=device)
        with torch.inference_mode():
            out = hooked.run(model, hooked.embed(model, ids), last_layer=max(layers), reads=reads)
        yield ({layer: out.resid[layer + 1][:, skip_first:].reshape(-1, out.resid[layer + 1].size(-1)).float().cpu()
                for layer in layers}, ids.numel())


class ShuffleBuffer:
    """Rows gathered from many batches and handed out in random order, so that neighbouring tokens of one
    sequence (alike) do not make up a training batch together. A fixed tensor: a row taken leaves a hole
    that the buffer's last row fills."""

    def __init__(self, size: int, width: int, seed: int = 0) -> None:
        self.data = torch.empty(size, width)
        self.n = 0
        self.generator = torch.Generator().manual_seed(seed)

    def add(self, block: torch.Tensor) -> torch.Tensor:
        """Add rows while there is room -> the rows that did not fit."""
        room = min(self.data.size(0) - self.n, block.size(0))
        self.data[self.n:self.n + room] = block[:room]
        self.n += room
        return block[room:]

    def full(self) -> bool:
        return self.n == self.data.size(0)

    def take(self, n: int) -> torch.Tensor:
        """n random rows (all there are, when fewer), removed from the buffer."""
        n = min(n, self.n)
        chosen = torch.randperm(self.n, generator=self.generator)[:n]
        out = self.data[chosen].clone()
        taken = torch.zeros(self.n, dtype=torch.bool)
        taken[chosen] = True
        last = torch.arange(self.n - n, self.n)
        holes = chosen[chosen < self.n - n]
        self.data[holes] = self.data[last[~taken[last]]]
        self.n -= n
        return out
