"""What a conversation's export says of each reply beyond its text (issue 31): every token with the model's
odds for it (None: typed by a person into a branch), from the reply's kept details."""

from __future__ import annotations

from typing import Any

from webapp.chat.decode.odds import TokenOdds
from webapp.chat.records import Message
from webapp.chat.service import ChatError, ChatService
from webapp.chat.web.token_views import token_text


def with_tokens(service: ChatService, messages: list[Message]) -> list[dict[str, Any]]:
    """The messages as export.json shows them (Message.as_dict), each reply's "tokens" [{id, text, p, p_sampled,
    rank}] in place of their count (text None where the model that wrote it is not run here: the ids and odds
    are still the reply's own)."""
    replies = [m.id for m in messages if m.is_reply]
    details = service.details_of(replies) if replies else {}
    out = []
    for message in messages:
        found = message.as_dict()
        rows = details[message.id].odds if message.id in details else None
        if rows:
            try:
                tokenizer = service.writer(message).tokenizer
            except ChatError:
                tokenizer = None
            found["tokens"] = [{"id": o.token, "text": token_text(tokenizer, o.token)[0] if tokenizer else None,
                                "p": o.probability, "p_sampled": o.sampled_probability, "rank": o.rank}
                               for o in map(TokenOdds.from_row, rows)]
        out.append(found)
    return out
