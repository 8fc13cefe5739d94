"""The JSON objects of OpenAI's API, built from what a reply's job published.

Logprobs come from the odds the batched step computed for each token (webapp/chat/decode/odds.py), the same
numbers the chat page shows: `logprob` is the log of the token's probability under the model (at
temperature 1, as OpenAI and llama.cpp report it), `top_logprobs` the model's most likely tokens, at
most TOP_ALTERNATIVES. Each chat entry also carries Glassbox's extras: `rank`, `sampled_probability`
(under the distribution the token was drawn from, after temperature and top-k) and `entropy_bits`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from webapp.chat.decode.odds import TokenOdds
from webapp.chat.model.tokenizer import special_name, token_bytes

FLOOR_LOGPROB = -9999.0  # what OpenAI reports for a token of probability 0 (JSON has no -Infinity)


@dataclass(frozen=True)
class Meta:
    """What every object of one reply repeats."""

    id: str
    created: int
    model: str
    system_fingerprint: str

    @classmethod
    def new(cls, prefix: str, job_id: str, model: str, loaded) -> Meta:
        return cls(f"{prefix}-{job_id}", int(time.time()), model, fingerprint(loaded))


def fingerprint(loaded) -> str:
    """The checkpoint's content hash (checkpoint_id is `name@sha256-prefix`): same fingerprint, same weights."""
    return "fp_" + loaded.checkpoint_id.rpartition("@")[2]


def model_card(model_id: str, loaded, created: int) -> dict:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "glassbox",
            # extensions, as llama.cpp's server adds `meta`: what is loaded, and its window
            "checkpoint": loaded.checkpoint_id, "description": loaded.description,
            "context_length": loaded.block_size}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


# -- tokens ------------------------------------------------------------------------------------------
def token_text(tokenizer, token: int) -> str:
    """How a token is written in logprobs: its text, a byte of a split character as \\xNN (as OpenAI
    writes one), a special by its name."""
    data = token_bytes(tokenizer, token)
    if data is None:
        return special_name(tokenizer, token) or f"<|unused_{token}|>"
    return data.decode("utf-8", errors="backslashreplace")


def logprob(p: float | None) -> float | None:
    """None where the probability is not known (a token typed into a branch, or a remote token's later piece)."""
    if p is None:
        return None
    return math.log(p) if p > 0 else FLOOR_LOGPROB


def _entry(tokenizer, token: int, p: float | None) -> dict:
    data = token_bytes(tokenizer, token)
    return {"token": token_text(tokenizer, token), "logprob": logprob(p),
            "bytes": None if data is None else list(data)}


def chat_logprobs(tokens: list[tuple[int, int, TokenOdds]], top: int, tokenizer) -> dict:
    """tokens: (text offset, id, odds) of the tokens sent -> the chat `logprobs` object."""
    content = []
    for _, token, odds in tokens:
        content.append({**_entry(tokenizer, token, odds.probability),
                        "top_logprobs": [_entry(tokenizer, i, p) for i, p, _ in odds.alternatives[:top]],
                        "rank": odds.rank, "sampled_probability": odds.sampled_probability,
                        "entropy_bits": odds.entropy_bits})
    return {"content": content, "refusal": None}


def text_logprobs(tokens: list[tuple[int, int, TokenOdds]], top: int, tokenizer) -> dict:
    """The legacy /v1/completions `logprobs` object: parallel lists, text offsets into the completion."""
    return {"tokens": [token_text(tokenizer, t) for _, t, _ in tokens],
            "token_logprobs": [logprob(o.probability) for _, _, o in tokens],
            "top_logprobs": [{token_text(tokenizer, i): logprob(p) for i, p, _ in o.alternatives[:top]}
                             for _, _, o in tokens],
            "text_offset": [offset for offset, _, _ in tokens]}


def logprobs_of(kind: str, tokens, top: int | None, tokenizer) -> dict | None:
    if top is None:
        return None
    return (chat_logprobs if kind == "chat" else text_logprobs)(tokens, top, tokenizer)


# -- whole replies and stream chunks ----------------------------------------------------------------
def _head(meta: Meta, obj: str) -> dict:
    return {"id": meta.id, "object": obj, "created": meta.created, "model": meta.model,
            "system_fingerprint": meta.system_fingerprint}


def completion(kind: str, meta: Meta, text: str, logprobs: dict | None, finish: str, used: dict) -> dict:
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                  "logprobs": logprobs, "finish_reason": finish}
        return {**_head(meta, "chat.completion"), "choices": [choice], "usage": used}
    choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
    return {**_head(meta, "text_completion"), "choices": [choice], "usage": used}


def chunk(kind: str, meta: Meta, *, text: str | None = None, logprobs: dict | None = None,
          finish: str | None = None, role: bool = False) -> dict:
    """One streamed piece. Chat: the first carries the role, the last an empty delta and the
    finish_reason; /v1/completions: each carries its text."""
    if kind == "chat":
        delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {**_head(meta, "chat.completion.chunk"), "choices": [choice]}
    choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
    return {**_head(meta, "text_completion"), "choices": [choice]}


def usage_chunk(kind: str, meta: Meta, used: dict) -> dict:
    """stream_options.include_usage: one last chunk with no choices and the usage."""
    return {**_head(meta, "chat.completion.chunk" if kind == "chat" else "text_completion"),
            "choices": [], "usage": used}
