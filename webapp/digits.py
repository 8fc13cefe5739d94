"""Whole numbers typed or sent as text. str.isdigit() says yes to "²", "①" and "٣", which int() refuses or reads
as another digit, and to 4,301 digits, which int() refuses (Python's limit on converting long strings): a check
that passed, then a 500. Every text that becomes a count goes through plain_digits first."""

from __future__ import annotations

import re

DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII digits, at most 18: any such number fits SQLite's INTEGER


def plain_digits(text: str) -> bool:
    """Whether int(text) reads text as the whole number it shows (ASCII digits, no sign, at most 18)."""
    return DIGITS.fullmatch(text) is not None
