"""Words the templates share: a count with its noun in the right number ("1 token", "2 tokens"), and a
probability as a room can compare it ("12.3%", "< 0.1%", its natural log "-7.42")."""

from __future__ import annotations

import math

from flask import Flask


def count_of(n: int, noun: str, plural: str | None = None) -> str:
    """`{{ n|quantity('token') }}` -> "1 token", "0 tokens", "1,024 tokens"."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def percent(p: float) -> str:
    """`{{ p|percent }}` -> "12.3%"; a probability too small to show at one decimal "< 0.1%", never "0.0%"."""
    if 0 < p < 0.0005:
        return "< 0.1%"
    return f"{p * 100:.1f}%"


def log_probability(p: float) -> str:
    """`{{ p|logprob }}` -> "-7.42" (ln p, where "< 0.1%" tells two small odds apart no more); "−∞" for 0."""
    return f"{math.log(p):.2f}" if p > 0 else "−∞"


def init_app(app: Flask) -> None:
    app.add_template_filter(count_of, "quantity")  # not "count": Jinja's own is length
    app.add_template_filter(percent, "percent")
    app.add_template_filter(log_probability, "logprob")
