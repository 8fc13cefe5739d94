"""The glass-box views of a reply, as plain data for the templates: its tokens with their odds, and the
exact prompt it was given. Token text is shown honestly: a token that is not whole UTF-8 (a byte
inside a character) is shown as its bytes, e.g. ⟨e6 9d⟩."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from webapp.chat.decode.odds import TokenOdds
from webapp.chat.decode.types import Forced
from webapp.chat.model.prompt import PromptReport
from webapp.chat.model.tokenizer import special_name, token_bytes
from webapp.chat.records import ReplyDetails

SHADES = 10  # probability buckets, each a CSS class (the CSP allows no inline styles)
# What a special token would mean at that point of a reply. Any special ends a reply without being
# shown, so choosing one as a branch ends the reply there: the panel says so before offering it.
SPECIAL_MEANINGS = {
    "<|assistant_end|>": "the end of the reply",
    "<|user_start|>": "the start of the person's next turn",
    "<|user_end|>": "the end of the person's turn",
    "<|assistant_start|>": "the start of another reply",
    "<|bos|>": "the start of a new conversation",
}


def token_text(tokenizer, token: int) -> tuple[str, bool]:
    """-> (what to show, whether it is whole text). Specials show as their names."""
    data = token_bytes(tokenizer, token)
    if data is None:
        return special_name(tokenizer, token) or f"<|special {token}|>", True
    try:
        return data.decode("utf-8"), True
    except UnicodeDecodeError:
        return "⟨" + " ".join(f"{b:02x}" for b in data) + "⟩", False


def special_meaning(tokenizer, token: int) -> str | None:
    """What a special token stands for (None for an ordinary one)."""
    if not tokenizer.is_special(token):
        return None
    return SPECIAL_MEANINGS.get(special_name(tokenizer, token) or "", "a special token outside the chat's five")


# Whitespace has no visible text and no spoken one: a token made of it is named (links, headings).
WHITESPACE_NAMES = {" ": ("space", "spaces"), "\n": ("newline", "newlines"), "\t": ("tab", "tabs"),
                    "\r": ("carriage return", "carriage returns"), "\u00a0": ("no-break space", "no-break spaces")}


def whitespace_name(text: str) -> str | None:
    """A name for a token that is only whitespace ("space", "2 newlines", "space, tab"); None for any other."""
    if text.strip():
        return None
    if not text:
        return "empty"
    parts = []
    for char, run in itertools.groupby(text):
        n = len(list(run))
        one, many = WHITESPACE_NAMES.get(char, (f"U+{ord(char):04X}", f"U+{ord(char):04X}"))
        parts.append(one if n == 1 else f"{n} {many}")
    return ", ".join(parts)


class Named:
    """A token shown by its text: `name` is what it is called aloud (its text, or for whitespace a word:
    "space"), which the pages show beside a text that shows nothing."""

    text: str

    @property
    def name(self) -> str:
        return whitespace_name(self.text) or self.text


def residual_label(layer: int) -> str:
    """A row of the residual stream (the logit lens, residual patching): row 0 the embeddings, row l the output
    of block l - 1. Blocks and heads count from 0 on every page, as the ablation form, the API and
    TransformerLens count them."""
    return "embeddings" if layer == 0 else f"after block {layer - 1}"


def shade(probability: float) -> int:
    """0 (unlikely) .. SHADES - 1 (certain): the class a token's probability gives it."""
    return min(SHADES - 1, max(0, int(probability * SHADES)))


@dataclass
class Alternative(Named):
    token: int
    text: str
    probability: float
    sampled_probability: float
    chosen: bool
    special: str | None = None  # a special token: what it means (choosing it ends the reply there)


@dataclass
class TokenView(Named):
    index: int
    token: int
    text: str
    whole: bool  # False: a byte of a character, shown as bytes
    probability: float | None  # None: typed into a branch, not sampled
    sampled_probability: float | None
    rank: int | None
    entropy_bits: float | None
    shade: int | str  # 0..SHADES-1, or "typed"
    alternatives: list[Alternative]

    @property
    def blank(self) -> bool:
        """Only whitespace: its text shows nothing, so pages show its name beside it."""
        return whitespace_name(self.text) is not None


def token_views(tokenizer, rows: list) -> list[TokenView]:
    """Stored odds rows (TokenOdds.as_row) -> what the token view and its panel show."""
    views = []
    for index, row in enumerate(rows):
        odds = TokenOdds.from_row(row)
        text, whole = token_text(tokenizer, odds.token)
        alternatives = [Alternative(t, token_text(tokenizer, t)[0], p, q, t == odds.token,
                                    special_meaning(tokenizer, t))
                        for t, p, q in odds.alternatives]
        look = "typed" if odds.probability is None else shade(odds.probability)
        views.append(TokenView(index, odds.token, text, whole, odds.probability, odds.sampled_probability,
                               odds.rank, odds.entropy_bits, look, alternatives))
    return views


DAMAGED_ODDS = "The token odds saved with this reply are damaged and cannot be read, so it is shown without them."
DAMAGED_PROMPT = "The prompt saved with this reply is damaged and cannot be read."


def readable_token_views(tokenizer, details: ReplyDetails) -> tuple[list[TokenView], str | None]:
    """A reply's token views from its stored details (ChatStore.details), or none and why not: odds
    whose row is damaged show the reply without them rather than fail the page."""
    if "odds" in details.damaged:
        return [], DAMAGED_ODDS
    try:
        return token_views(tokenizer, details.odds or []), None
    except (TypeError, ValueError, IndexError, KeyError):  # JSON, but not rows this code wrote
        return [], DAMAGED_ODDS


def first_difference(a: list[TokenView], b: list[TokenView], same_vocabulary: bool = True) -> int | None:
    """The index of the first token where two replies differ (None: one is the other's start, or equal).
    Two models with other vocabularies (an id means another text in each) are compared by the tokens' text."""
    for i, (x, y) in enumerate(zip(a, b)):
        if (x.token != y.token) if same_vocabulary else (x.text != y.text):
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


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


def branch_tokens(tokenizer, rows: list, form, max_chars: int) -> Forced:
    """A branch's first tokens from the form: the reply's tokens before `index`, then `token` (one of the
    alternatives shown there) or the tokens of `text` (a continuation typed by hand). Raises ValueError
    with a message for the person."""
    try:
        index = int(form.get("index", ""))
    except ValueError:
        raise ValueError("Choose a token of the reply to branch from.") from None
    if not 0 <= index < len(rows):
        raise ValueError(f"The reply has tokens 1 to {len(rows)}; there is no token {index + 1}.")
    kept = [TokenOdds.from_row(row) for row in rows[:index]]
    at = TokenOdds.from_row(rows[index])
    text = form.get("text", "")
    if form.get("token", "") != "" and at.typed:
        raise ValueError("That token was typed, not sampled: it has no alternatives. Type a continuation.")
    if form.get("token", "") != "":
        try:
            token = int(form["token"])
        except ValueError:
            raise ValueError("Choose one of the alternatives shown.") from None
        place = next((i for i, (t, _, _) in enumerate(at.alternatives) if t == token), None)
        if place is None:
            raise ValueError("Choose one of the alternatives shown, or type a continuation.")
        _, p, q = at.alternatives[place]
        picked: list[TokenOdds | None] = [TokenOdds(token, p, q, place + 1, at.entropy_bits, at.alternatives)]
        tokens = [token]
    elif text.strip():
        if len(text) > max_chars:
            raise ValueError(f"A continuation may be at most {max_chars} characters.")
        tokens = tokenizer.encode_ordinary(text)
        picked = [None] * len(tokens)  # typed, not sampled: no odds of its own
    else:
        raise ValueError("Choose an alternative, or type how the reply should go on.")
    return Forced(tuple([o.token for o in kept] + tokens),
                  tuple(None if o.typed else o for o in kept) + tuple(picked), at=index)
