"""Parsing and bounding what the chat forms send.  Each error names its field."""

from __future__ import annotations

import math

from webapp.chat.decode.types import SamplingParams
from webapp.digits import plain_digits

SEED_MAX = 2**32 - 1
TOP_K_MAX = 200


class FormError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message

    @property
    def errors(self) -> dict[str, str]:
        """Every field's message (one here; FormErrors has them all)."""
        return {self.field: self.message}


class FormErrors(FormError):
    """Several fields wrong at once. field/message are the first, so a caller that shows one still can."""

    def __init__(self, errors: dict[str, str]) -> None:
        field, message = next(iter(errors.items()))
        super().__init__(field, message)
        self._errors = dict(errors)

    @property
    def errors(self) -> dict[str, str]:
        return dict(self._errors)


def parse_content(form, max_chars: int, field: str = "content") -> str:
    content = form.get(field, "")
    if not isinstance(content, str) or not content.strip():
        raise FormError(field, "Write a message first.")
    if len(content) > max_chars:
        raise FormError(field, f"Messages are limited to {max_chars:,} characters; this one has {len(content):,}.")
    if "\x00" in content:
        raise FormError(field, "Messages cannot contain NUL characters.")
    return content


SAMPLING_FIELDS = ("temperature", "top_k", "max_new_tokens", "seed")


def parse_sampling(form, *, default_max_new_tokens: int, max_new_tokens_limit: int) -> SamplingParams:
    """Each field is optional; an empty field takes its default. Raises FormErrors naming every bad field."""
    errors: dict[str, str] = {}

    def check(*args):
        try:
            return _number(form, *args)
        except FormError as error:
            errors[error.field] = error.message

    temperature = check("temperature", 1.0, float, 0.0, 2.0, "Temperature must be a number from 0 to 2.")
    top_k = check("top_k", 50, int, 0, TOP_K_MAX,
                  f"Top-k must be a whole number from 0 to {TOP_K_MAX} (0 means the whole vocabulary).")
    max_new = check("max_new_tokens", min(default_max_new_tokens, max_new_tokens_limit), int, 1,
                    max_new_tokens_limit, f"Max new tokens must be a whole number from 1 to {max_new_tokens_limit}.")
    seed = check("seed", None, int, 0, SEED_MAX, f"Seed must be empty or a whole number from 0 to {SEED_MAX}.")
    if errors:
        raise FormErrors(errors)
    return SamplingParams(max_new_tokens=max_new, temperature=temperature, top_k=top_k, seed=seed)


def parse_message(form, max_chars: int, *, default_max_new_tokens: int,
                  max_new_tokens_limit: int) -> tuple[str, SamplingParams]:
    """The composer's whole form at once: the message and its sampling settings, every error together."""
    errors: dict[str, str] = {}
    content = sampling = None
    try:
        content = parse_content(form, max_chars)
    except FormError as error:
        errors.update(error.errors)
    try:
        sampling = parse_sampling(form, default_max_new_tokens=default_max_new_tokens,
                                  max_new_tokens_limit=max_new_tokens_limit)
    except FormError as error:
        errors.update(error.errors)
    if errors or content is None or sampling is None:
        raise FormErrors(errors)
    return content, sampling


def submitted_sampling(form) -> dict[str, str]:
    """What was typed in each sampling field, to give it back beside its error (never parsed)."""
    values = {}
    for name in SAMPLING_FIELDS:
        raw = form.get(name)
        if isinstance(raw, str):
            values[name] = raw[:100]
    return values


def remembered_sampling(value, *, default_max_new_tokens: int, max_new_tokens_limit: int) -> SamplingParams | None:
    """Settings kept in the session (a dict from SamplingParams.as_dict), checked again: the limit may have moved."""
    if not isinstance(value, dict):
        return None
    form = {k: "" if value.get(k) is None else str(value[k]) for k in SAMPLING_FIELDS}
    if plain_digits(form["max_new_tokens"]):
        form["max_new_tokens"] = str(min(int(form["max_new_tokens"]), max_new_tokens_limit))
    try:
        return parse_sampling(form, default_max_new_tokens=default_max_new_tokens,
                              max_new_tokens_limit=max_new_tokens_limit)
    except FormError:
        return None


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
