"""A pace people can watch (issue 31): replaying a saved reply at a chosen number of tokens a second, from its
stored tokens and odds, and the optional presentation pace (GLASSBOX_PRESENTATION_PACE) that spreads a live
reply's tokens to the screen at most that fast. The job runs at full speed either way: only the stream waits.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Iterator

from flask import current_app

from webapp.chat.decode.odds import TokenOdds
from webapp.chat.decode.publish import TokenEvent
from webapp.chat.model.tokenizer import token_bytes
from webapp.core.jobs import Event

# The paces a replay may ask for, in tokens per second: slow enough to point at one token, fast enough to
# get through a long reply; a pace outside is refused (400), never clamped without saying so.
MIN_PACE, MAX_PACE = 0.5, 200.0
DEFAULT_PACE = 5.0
PACES = (1, 2, 5, 10, 20, 50)  # the choices the control under each reply offers


class BadPace(ValueError):
    pass


def parse_pace(text: str | None) -> float:
    """A replay's pace from ?pace= (missing: DEFAULT_PACE) -> tokens per second; BadPace says what is wrong."""
    if text is None or text == "":
        return DEFAULT_PACE
    try:
        pace = float(text)
    except ValueError:
        raise BadPace(f"pace must be a number of tokens per second, from {MIN_PACE:g} to {MAX_PACE:g}.") from None
    if not MIN_PACE <= pace <= MAX_PACE:  # NaN fails this too
        raise BadPace(f"pace must be from {MIN_PACE:g} to {MAX_PACE:g} tokens per second (got {text[:20]}).")
    return pace


def presentation_pace() -> float:
    """GLASSBOX_PRESENTATION_PACE: tokens a second a live reply is shown at, at most (0: as fast as written)."""
    return float(current_app.config["GLASSBOX"].presentation_pace)


def paced(source: Iterator[Event | list[Event] | None], pace: float) -> Iterator[Event | list[Event] | None]:
    """`source`'s events with its `token` events spread to at most `pace` a second (0: untouched). The events
    that came together are given one by one, each token after its turn."""
    if not pace:
        yield from source
        return
    gap, due = 1.0 / pace, 0.0
    for item in source:
        if item is None:
            yield None
            continue
        for event in [item] if isinstance(item, Event) else item:
            if event.name == "token":
                now = time.monotonic()
                if due > now:
                    time.sleep(due - now)
                due = max(due, now) + gap
            yield event


def replay_events(tokenizer, odds_rows: list, pace: float, start: float | None = None) -> Iterator[Event]:
    """A saved reply's events as its live stream gave them (`running`, then one `token` per token, with its
    odds), token i at (i + 1)/pace seconds after `start` (time.monotonic(); None: now). A presented
    conversation's followers replay it on the same clock (webapp/chat/web/present.py)."""
    start = time.monotonic() if start is None else start
    yield Event("running", {})
    for index, event in enumerate(reply_tokens(tokenizer, odds_rows)):
        due = start + (index + 1) / pace
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        yield event


def reply_tokens(tokenizer, odds_rows: list) -> Iterator[Event]:
    """A saved reply's `token` events, one per token and none waited for. Text is decoded as the live decoder
    does: a token inside a character gives its text with the token that completes it; specials are not text."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")  # as the live decoder (generate.py)
    for index, row in enumerate(odds_rows):
        odds = TokenOdds.from_row(row)
        data = token_bytes(tokenizer, odds.token)
        text = decoder.decode(data) if data is not None else ""
        yield Event("token", TokenEvent(text, index, odds.token, odds))
    rest = decoder.decode(b"", final=True)
    if rest:
        yield Event("token", TokenEvent(rest))
