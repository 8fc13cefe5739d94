"""Parsing and bounding what the chat forms send.  Each error names its field."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

SEED_MAX = 2**32 - 1
TOP_K_MAX = 200


class FormError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_k: int = 50
    max_new_tokens: int = 200
    seed: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def parse_content(form, max_chars: int, field: str = "content") -> str:
    content = form.get(field, "")
    if not isinstance(content, str) or not content.strip():
        raise FormError(field, "Write a message first.")
    if len(content) > max_chars:
        raise FormError(field, f"Messages are limited to {max_chars:,} characters; this one has {len(content):,}.")
    if "\x00" in content:
        raise FormError(field, "Messages cannot contain NUL characters.")
    return content


def parse_sampling(form, *, default_max_new_tokens: int, max_new_tokens_limit: int) -> Sampling:
    """Each field is optional; an empty field takes its default."""
    temperature = _number(form, "temperature", 1.0, float, 0.0, 2.0,
                          "Temperature must be a number from 0 to 2.")
    top_k = _number(form, "top_k", 50, int, 0, TOP_K_MAX,
                    f"Top-k must be a whole number from 0 to {TOP_K_MAX} (0 means the whole vocabulary).")
    max_new = _number(form, "max_new_tokens", min(default_max_new_tokens, max_new_tokens_limit), int, 1,
                      max_new_tokens_limit,
                      f"Max new tokens must be a whole number from 1 to {max_new_tokens_limit}.")
    seed = _number(form, "seed", None, int, 0, SEED_MAX,
                   f"Seed must be empty or a whole number from 0 to {SEED_MAX}.")
    return Sampling(temperature, top_k, max_new, seed)


def _number(form, field, default, kind, low, high, message):
    raw = form.get(field, "")
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return default
    try:
        value = kind(raw.strip()) if isinstance(raw, str) else kind(raw)
    except (TypeError, ValueError, OverflowError):
        raise FormError(field, message)
    if isinstance(value, float) and not math.isfinite(value):
        raise FormError(field, message)
    if not low <= value <= high:
        raise FormError(field, message)
    return value
