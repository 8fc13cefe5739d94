"""Words the templates share: a count with its noun in the right number ("1 token", "2 tokens")."""

from __future__ import annotations

from flask import Flask


def count_of(n: int, noun: str, plural: str | None = None) -> str:
    """`{{ n|quantity('token') }}` -> "1 token", "0 tokens", "1,024 tokens"."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def init_app(app: Flask) -> None:
    app.add_template_filter(count_of, "quantity")  # not "count": Jinja's own is length
