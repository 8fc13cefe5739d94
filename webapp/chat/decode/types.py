"""What the chat's decode layer takes and gives: the one sampling type (forms and /v1 parse into it), a
reply's request, and its result as the executors fill it and the service saves it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from webapp.chat.decode.odds import TokenOdds
from webapp.chat.decode.readings import Reading
from webapp.chat.model.edits import Edit
from webapp.core.jobs import Job


@dataclass(frozen=True)
class SamplingParams:
    """How a reply is sampled: what the chat forms, a branch and /v1 all parse into."""

    max_new_tokens: int = 200
    temperature: float = 1.0  # 0: greedy
    top_k: int = 50  # 0: the whole vocabulary
    seed: int | None = None  # a private generator; the global RNG is never touched

    def check(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = whole vocabulary), got {self.top_k}")

    def as_dict(self) -> dict[str, float | int | None]:
        """As saved with a reply and kept in the session, in the order the chat page shows them."""
        return {"temperature": self.temperature, "top_k": self.top_k, "max_new_tokens": self.max_new_tokens,
                "seed": self.seed}

    @classmethod
    def saved(cls, settings: dict[str, Any] | None) -> SamplingParams:
        """What a reply was written with, from its saved settings (its seed too): a new version uses the same."""
        return cls(**{k: v for k, v in (settings or {}).items() if k in ("max_new_tokens", "temperature", "top_k",
                                                                          "seed")})


@dataclass(frozen=True)
class Forced:
    """The first tokens of a reply branched from another version's token: kept tokens, then the pick,
    with their odds where known (None for a token typed by hand)."""

    tokens: tuple[int, ...] = ()
    odds: tuple[TokenOdds | None, ...] = ()
    at: int | None = None  # the first token a person gave (0-based): the reply is "branched at token at + 1"


@dataclass(frozen=True)
class ChatRequest:
    """A reply to generate: the prompt's token ids and the reply's sampling settings."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    odds: bool = True  # record each token's odds (webapp/chat/decode/odds.py)
    features: bool = True  # read each token's features by the model's dictionaries (decode/readings.py)
    forced: tuple[int, ...] = ()  # the reply's first tokens, given (a branch from a token: Forced.tokens)
    forced_odds: tuple[TokenOdds | None, ...] = ()  # their odds where known (Forced.odds)
    edit: Edit | None = None  # heads' and MLPs' outputs replaced in every forward (webapp/chat/model/edits.py)


@dataclass(frozen=True)
class ReplyStats:
    tokens: int | None = None
    ttft_seconds: float | None = None
    tokens_per_second: float | None = None
    wait_seconds: float | None = None  # in line before the reply started (its first token is timed from then)


def decode_rate(tokens: int, first_s: float | None, last_s: float) -> float | None:
    """Tokens per second after the first token: (tokens - 1) over the time since the first. The one
    definition every reply's figure uses (local, batched or remote). `tokens` counts sampled tokens only:
    a branch's given tokens cost no decode step, and counting them made rates in the thousands."""
    if tokens > 1 and first_s is not None and last_s > first_s:
        return (tokens - 1) / (last_s - first_s)
    return None


@dataclass
class ChatResult:
    """A reply as it grows: filled by the executor on the worker, read by the service when it saves."""

    text: list[str] = field(default_factory=list)  # printable pieces, in order
    token_ids: list[int] = field(default_factory=list)
    odds: list[TokenOdds] = field(default_factory=list)  # one per token
    features: list[tuple[Reading, ...] | None] = field(default_factory=list)  # at the end, one per token: what the
    # model's dictionaries read where it was sampled (webapp/chat/decode/readings.py ReplyReader)
    stats: ReplyStats = ReplyStats()
    first_s: float | None = None  # seconds from the start to the first sampled token
    given: int = 0  # tokens given rather than sampled (a branch's kept tokens and pick), first in token_ids
    stop_reason: str | None = None  # as GenerationStats: "end", "length", ...; None while it runs
    # a remote backend's reply: its length in the backend's tokens (its usage, else its logprobs entries), which
    # token_ids (the local tokenizer's pieces) need not match; None: a local reply, or a backend that said neither
    backend_tokens: int | None = None

    @property
    def reply(self) -> str:
        return "".join(self.text)


ChatJob: TypeAlias = "Job[ChatRequest, ChatResult]"  # a chat reply's job
