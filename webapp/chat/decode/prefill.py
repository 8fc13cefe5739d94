"""Prefill beyond one reply: the next chunks of several newcomers in one pass (prefill_step, the batched
decoder's) and the head every prompt starts with, prefilled once at warm-up and pinned (pin_prompt_head)."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

import torch

from webapp.chat.decode.generate import Sequence, prefill_chunk, tap, tapped, tapping
from webapp.chat.decode.prefix_cache import PrefixCache
from webapp.chat.model.gpt import Chunk
from webapp.chat.model.loading import LoadedChatModel


def pin_prompt_head(loaded: LoadedChatModel, head: Seq[int], prefix: PrefixCache) -> None:
    """Run the head every prompt starts with (bos and the few-shot turns) once, in the chunks a prompt's
    prefill cuts, and pin its keys and values in the model's prefix cache (PrefixCache.pin): every reply
    then starts from a copy of them and prefills only its own turns. On the worker (at warm-up)."""
    model: Any = loaded.model  # a GPT with a KV cache (new_cache, prefill)
    chunk = prefill_chunk(model)
    cache = model.new_cache(1, len(head))
    with torch.inference_mode():
        for start in range(0, len(head), chunk):
            model.prefill([Chunk(head[start:start + chunk], cache, start, logits=False)])
    prefix.pin(cache, head, loaded.block_size, model)


def prefill_step(model: Any, seqs: list[Sequence]) -> dict[int, Exception]:
    """The next prefill chunk of each of these Sequences; -> the failures, by index in seqs.

    Where the model can (GPT.prefills_together) the chunks run side by side in one pass, the weights read
    once for all of them, each chunk's bits the same as alone; if that pass fails, each chunk runs again
    alone, so a prompt that fails fails alone."""
    if len(seqs) > 1 and getattr(model, "prefills_together", lambda: False)():
        ending = [s for s in seqs if s.last_chunk]  # the chunks given logits, in order: their rows in the taps
        taps = tap(frozenset().union(*(s.reader.blocks for s in ending)))
        try:
            with torch.inference_mode():
                logits = model.prefill([s.chunk_to_run for s in seqs], *tapping(taps))
        except Exception:  # one chunk's failure must not fail the others: try each alone
            pass
        else:
            errors: dict[int, Exception] = {}
            for i, (seq, found) in enumerate(zip(seqs, logits)):
                streams = tapped(taps, ending.index(seq), seq.reader.blocks) if seq.last_chunk else None
                try:
                    seq.prefilled(found, streams)  # samples the first token after a prompt's last chunk
                except Exception as exc:
                    errors[i] = exc
            return errors
    errors = {}
    for i, seq in enumerate(seqs):
        try:
            seq.prefill_chunk()
        except Exception as exc:
            errors[i] = exc
    return errors
