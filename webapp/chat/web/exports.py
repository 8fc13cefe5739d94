"""What a conversation's export says of each reply beyond its text (issue 31): every token with the model's
odds for it (None: typed by a person into a branch), from the reply's kept details."""

from __future__ import annotations

from webapp.chat.decode.odds import TokenOdds
from webapp.chat.service import ChatError, ChatService
from webapp.chat.web.token_views import token_text


def with_tokens(service: ChatService, messages: list[dict]) -> list[dict]:
    """The messages, each reply with "tokens": [{id, text, p, p_sampled, rank}] (text None where the model
    that wrote it is not run here: the ids and odds are still the reply's own)."""
    replies = [m["id"] for m in messages if m["role"] == "assistant"]
    details = service.details_of(replies) if replies else {}
    out = []
    for message in messages:
        rows = details[message["id"]].odds if message["id"] in details else None
        if not rows:
            out.append(message)
            continue
        try:
            tokenizer = service.writer(message).tokenizer
        except ChatError:
            tokenizer = None
        odds = [TokenOdds.from_row(row) for row in rows]
        out.append({**message, "tokens": [
            {"id": o.token, "text": token_text(tokenizer, o.token)[0] if tokenizer else None,
             "p": o.probability, "p_sampled": o.sampled_probability, "rank": o.rank} for o in odds]})
    return out
