"""The glass-box views of a reply, as plain data for the templates: its tokens with their odds, and the
exact prompt it was given. Token text is shown honestly: a token that is not whole UTF-8 (a byte
inside a character) is shown as its bytes, e.g. ⟨e6 9d⟩."""

from __future__ import annotations

from dataclasses import dataclass

from webapp.chat.odds import TokenOdds
from webapp.chat.prompt import PromptReport

SHADES = 10  # probability buckets, each a CSS class (the CSP allows no inline styles)


def token_text(tokenizer, token: int) -> tuple[str, bool]:
    """-> (what to show, whether it is whole text). Specials show as their names."""
    if tokenizer.is_special(token):
        names = {i: name for name, i in tokenizer.special_ids.items()}
        return names.get(token, f"<|special {token}|>"), True
    data = tokenizer.decode_single_token_bytes(token)
    try:
        return data.decode("utf-8"), True
    except UnicodeDecodeError:
        return "⟨" + " ".join(f"{b:02x}" for b in data) + "⟩", False


def shade(probability: float) -> int:
    """0 (unlikely) .. SHADES - 1 (certain): the class a token's probability gives it."""
    return min(SHADES - 1, max(0, int(probability * SHADES)))


@dataclass
class Alternative:
    token: int
    text: str
    probability: float
    sampled_probability: float
    chosen: bool


@dataclass
class TokenView:
    index: int
    token: int
    text: str
    whole: bool  # False: a byte of a character, shown as bytes
    probability: float
    sampled_probability: float
    rank: int
    entropy_bits: float
    shade: int
    alternatives: list[Alternative]


def token_views(tokenizer, rows: list) -> list[TokenView]:
    """Stored odds rows (TokenOdds.as_row) -> what the token view and its panel show."""
    views = []
    for index, row in enumerate(rows):
        odds = TokenOdds.from_row(row)
        text, whole = token_text(tokenizer, odds.token)
        alternatives = [Alternative(t, token_text(tokenizer, t)[0], p, q, t == odds.token)
                        for t, p, q in odds.alternatives]
        views.append(TokenView(index, odds.token, text, whole, odds.probability, odds.sampled_probability,
                               odds.rank, odds.entropy_bits, shade(odds.probability), alternatives))
    return views


@dataclass
class PromptPartView:
    kind: str
    role: str | None
    text: str | None
    tokens: list[tuple[int, str]]  # (id, shown text), empty for a dropped turn
    count: int


def prompt_view(tokenizer, data: dict) -> tuple[PromptReport, list[PromptPartView]]:
    report = PromptReport.from_dict(data)
    parts = [PromptPartView(p.kind, p.role, p.text,
                            [(t, token_text(tokenizer, t)[0]) for t in report.ids[p.start:p.end]], p.tokens)
             for p in report.parts]
    return report, parts
