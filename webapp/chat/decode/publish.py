"""A generated piece of a reply, handed to its job: the event every stream renders, and the growing
result (webapp/chat/decode/types.py ChatResult) the service saves."""

from __future__ import annotations

from dataclasses import dataclass

from webapp.chat.decode.odds import TokenOdds
from webapp.chat.decode.pieces import Piece
from webapp.chat.decode.types import ChatJob, ChatResult, ReplyStats, decode_rate
from webapp.core.executors import Worker


@dataclass(frozen=True)
class TokenEvent:
    """A `token` event's data: a piece of a reply's text. `index` and `token`: the token's place in the reply
    and its id, None for text without a token of its own (what the decoder held back, flushed at the end;
    text followed from another front end); `odds`: the token's, None when not worked out."""

    text: str
    index: int | None = None
    token: int | None = None
    odds: TokenOdds | None = None


def chat_result(job: ChatJob) -> ChatResult:
    """The job's ChatResult (the service gives every chat job one; a bare job gets one here)."""
    if not isinstance(job.result, ChatResult):
        job.result = ChatResult()
    return job.result


def publish(job: ChatJob, piece: Piece, core: Worker) -> None:
    """One generated piece to its job: text for the stream and the saved reply, and the stats so far."""
    result = chat_result(job)
    if piece.token is not None:
        result.token_ids.append(piece.token)
        result.odds.append(piece.odds or TokenOdds.given(piece.token))  # one row per token
        # every token is an event, text or not (a byte inside a character): the page shows tokens too
        job.keep("token", TokenEvent(piece.text, piece.tokens - 1, piece.token, piece.odds))
    elif piece.text:  # the text the decoder held back, flushed at the end
        job.keep("token", TokenEvent(piece.text))
    if piece.text:
        result.text.append(piece.text)
    s = piece.stats
    if s is not None:  # the last piece: the generator's own figures
        result.stats = ReplyStats(s.new_tokens, s.time_to_first_token_s, s.decode_tokens_per_s)
        result.features = piece.readings or []
        result.stop_reason = s.stop_reason
    elif piece.tokens:
        core.count("tokens", 1, job)
        if piece.given:
            result.given += 1  # the reply's first tokens, given: timed neither as first token nor in the rate
        elif result.first_s is None:
            result.first_s = piece.elapsed_s
        result.stats = stats_so_far(result.first_s, piece.elapsed_s, piece.tokens, result.given)
        job.progress()  # saves the reply so far now and then (Job.on_progress): kill -9 keeps what was seen


def stats_so_far(first_s: float | None, elapsed_s: float, tokens: int, given: int = 0) -> ReplyStats:
    """Figures kept for a reply that ends before the generator's own stats (stopped, failed, remote); of its
    `tokens`, the `given` ones (a branch's) were not sampled and do not count in the rate."""
    return ReplyStats(tokens=tokens, ttft_seconds=first_s,
                      tokens_per_second=decode_rate(tokens - given, first_s, elapsed_s))
