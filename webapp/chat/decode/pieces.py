"""What the token generator yields (webapp/chat/decode/generate.py, recompute.py): a Piece per token, with its
printable text, and the reply's GenerationStats on the last one."""

from __future__ import annotations

import codecs
from collections.abc import Generator
from dataclasses import dataclass

from webapp.chat.decode.odds import TokenOdds
from webapp.chat.decode.readings import Reading


@dataclass
class GenerationStats:
    prompt_tokens: int
    new_tokens: int  # tokens kept in the reply (the stopping special token is not counted)
    time_to_first_token_s: float | None  # from the start to the first sampled token (prefill included)
    total_s: float
    decode_tokens_per_s: float | None  # sampled tokens after the first / time after the first (given ones excluded)
    stop_reason: str  # "end" (a special token), "length" (max_new_tokens), "cancelled"
    kv_cache: bool
    reused_tokens: int = 0  # prompt positions whose keys/values came from the prefix cache


@dataclass
class Piece:
    text: str  # newly printable text; "" while a multi-byte character is incomplete
    tokens: int  # reply tokens so far
    elapsed_s: float  # since the reply started
    stats: GenerationStats | None = None  # only on the last piece
    token: int | None = None  # the sampled id (None on the last piece)
    odds: TokenOdds | None = None  # what the model thought of it (when asked for: `odds=True`)
    # the last piece only, of a reply that asked for its features on a model with dictionaries: what they read at
    # each reply token, where it was sampled (None for a token given rather than sampled, or not read)
    readings: list[tuple[Reading, ...] | None] | None = None
    given: bool = False  # a token the reply was given (a branch's kept tokens and pick), not sampled


Pieces = Generator[Piece, None, None]  # closing it stops the reply (and frees its cache)


class TextDecoder:
    """Token bytes in, printable text out: UTF-8 decoded incrementally, and a trailing \r held back
    until the next piece, so a \r\n split across two tokens streams as one line break (the page
    and SSE both read a lone \r as a break of its own)."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="ignore")
        self._cr = ""

    def decode(self, data: bytes, final: bool = False) -> str:
        text = self._cr + self._utf8.decode(data, final=final)
        self._cr = "\r" if text.endswith("\r") and not final else ""
        return text[:-1] if self._cr else text
