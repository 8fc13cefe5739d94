"""OpenAI's wire format in and out: the conversation as `messages`, the request body, and each streamed
token's bytes and logprobs mapped onto the local tokenizer's ids and odds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from webapp.chat.decode.odds import TOP_ALTERNATIVES, TokenOdds
from webapp.chat.decode.types import ChatRequest
from webapp.chat.model.prompt import PromptBuilder
from webapp.chat.model.tokenizer import ChatTokenizer

JSON = dict[str, Any]  # a decoded JSON object


def messages_of(prompt: PromptBuilder, ids: Sequence[int]) -> list[JSON]:
    """The turns of a prompt built by PromptBuilder (bos, few-shot, turns, assistant start), as OpenAI
    messages; the local few-shot examples are left out (the remote applies its own template)."""
    body = list(ids)[1 + len(prompt.fewshot_ids):]
    if body and body[-1] == prompt.assistant_start:
        body = body[:-1]
    ends = {prompt.user_start: ("user", prompt.user_end), prompt.assistant_start: ("assistant", prompt.assistant_end)}
    messages: list[JSON] = []
    i = 0
    while i < len(body):
        role, end = ends.get(body[i], (None, None))
        if role is None or end is None:
            raise ValueError(f"unexpected token {body[i]} in a chat prompt")
        j = body.index(end, i + 1)
        data = b"".join(prompt.tokenizer.decode_single_token_bytes(t) for t in body[i + 1:j])
        messages.append({"role": role, "content": data.decode("utf-8", errors="replace")})
        i = j + 1
    return messages


# Sampling as Glassbox samples: temperature, then top-k, nothing else. Each server's own defaults differ
# (llama-cpp-python: top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1.1; llama-server: top_k 40, top_p
# 0.95, min_p 0.05; vLLM: the model's generation_config.json), so every filter and penalty is sent switched
# off. Each server ignores the fields it does not know (vLLM logs them); docs/scaling.md lists them per server.
NEUTRAL_SAMPLING = {"top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                    "repeat_penalty": 1.0,  # llama.cpp's name
                    "repetition_penalty": 1.0}  # vLLM's name
REPLACEMENT = "\ufffd".encode()  # U+FFFD: what vLLM sends as the bytes of a token that is part of a character


def request_body(prompt: PromptBuilder, request: ChatRequest, model: str = "") -> JSON:
    """The streamed /chat/completions request for a reply (`model`: empty for the server's own)."""
    p = request.params
    body: JSON = {"messages": messages_of(prompt, request.prompt_ids),
                  "max_tokens": p.max_new_tokens, "temperature": p.temperature, "stream": True,
                  "top_k": p.top_k,  # always: 0 (the whole vocabulary) is not every server's default
                  **NEUTRAL_SAMPLING}
    # the reply's token count as the backend counts it, in a last chunk (the front's own pieces are the local
    # tokenizer's: a byte-level front counts more than a BPE backend wrote); a server that does not know it
    # ignores it (llama-cpp-python), llama.cpp's server sends its `timings` anyway (see `reported_tokens`)
    body["stream_options"] = {"include_usage": True}
    if model:  # empty: the server's own (Glassbox, llama.cpp and vLLM serving one model take none)
        body["model"] = model
    if p.seed is not None:
        body["seed"] = p.seed
    if request.odds:
        body.update(logprobs=True, top_logprobs=TOP_ALTERNATIVES)
    return body


def reported_tokens(chunk: JSON) -> int | None:
    """The reply's token count as the backend says it in a streamed chunk: OpenAI's (and vLLM's, and
    Glassbox's) `usage.completion_tokens`, llama.cpp's server's `timings.predicted_n`, or its native
    `tokens_predicted`; None when this chunk says none of them."""
    usage, timings = chunk.get("usage"), chunk.get("timings")
    for value in ((usage or {}).get("completion_tokens") if isinstance(usage, dict) else None,
                  (timings or {}).get("predicted_n") if isinstance(timings, dict) else None,
                  chunk.get("tokens_predicted")):
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def entry_bytes(entry: JSON) -> bytes | None:
    """A logprobs entry's bytes (`bytes` when given, else its text); None when the server did not say.

    A token that is part of a multi-byte character has bytes no text can hold: llama-cpp-python's server
    then sends `bytes: null` and the token's text decoded on its own with the broken bytes dropped (often
    ""), and vLLM sends the bytes of U+FFFD. Such a token is still a token (see RemoteChat's `_chunk`)."""
    data = entry.get("bytes")
    raw = bytes(data) if data else str(entry.get("token") or "").encode()
    return None if not raw or raw == REPLACEMENT else raw


def continuation(token: int) -> TokenOdds:
    """The odds of a local piece after the first of one remote token: that token's odds are on its first
    piece, and given the first, the rest of the token was certain (probability 1), so the product over the
    pieces is the remote token's probability. Never None: every piece renders and goes out in /v1."""
    return TokenOdds(token, 1.0, 1.0, 1, 0.0, ((token, 1.0, 1.0),))


class TokenMap:
    """Remote tokens -> the local tokenizer's ids, by their bytes."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.tokenizer = tokenizer
        self._ids: dict[bytes, int] | None = None

    def _table(self) -> dict[bytes, int]:
        if self._ids is None:
            ids: dict[bytes, int] = {}
            t = self.tokenizer
            for i in range(getattr(t, "n_vocab", 0) or 0):
                if t.is_special(i):
                    continue
                try:
                    ids.setdefault(t.decode_single_token_bytes(i), i)
                except (KeyError, ValueError):
                    continue
            self._ids = ids
        return self._ids

    def one(self, data: bytes) -> int | None:
        return self._table().get(data)

    def ids(self, data: bytes) -> list[int]:
        single = self.one(data)
        if single is not None:
            return [single]
        return self.tokenizer.encode_ordinary(data.decode("utf-8", errors="replace")) if data else []


def odds_of(entry: JSON, token: int, tokens: TokenMap, temperature: float = 1.0, top_k: int = 0) -> TokenOdds:
    """An OpenAI logprobs entry -> TokenOdds. probability = exp(logprob), exact. Glassbox's own /v1 also
    sends the token's `sampled_probability`, `rank` and `entropy_bits`; other servers do not, and they
    are worked out from the alternatives sent (see `sampled_estimates`, `entropy_estimate`)."""
    chosen = entry_bytes(entry)
    # at most TOP_ALTERNATIVES: llama-cpp-python adds the chosen token after its top list, which is no rank
    sent = [(entry_bytes(alt), _p(alt.get("logprob"))) for alt in (entry.get("top_logprobs") or [])]
    top = [(data, p) for data, p in sent[:TOP_ALTERNATIVES] if data is not None]
    rank = entry.get("rank")
    if rank is None and chosen is not None:
        rank = next((i + 1 for i, (data, _) in enumerate(sent[:TOP_ALTERNATIVES]) if data == chosen), None)
    p = _p(entry.get("logprob"))
    key = b"\x00unknown" if chosen is None else chosen  # bytes unknown: a row of its own in the estimates
    q = sampled_estimates([*top, (key, p)], temperature, top_k)
    alternatives: list[tuple[int, float, float]] = []
    for data, alt_p in top:  # an alternative whose probability was not sent has nothing to show
        alt_id = tokens.one(data)
        if alt_id is not None and alt_p is not None and len(alternatives) < TOP_ALTERNATIVES \
                and alt_id not in [a for a, _, _ in alternatives]:
            alternatives.append((alt_id, alt_p, q.get(data, 0.0)))
    sampled = entry.get("sampled_probability")
    entropy = entry.get("entropy_bits")
    return TokenOdds(token, p, q.get(key) if sampled is None else sampled, rank,
                     entropy_estimate([x for _, x in top] or [p]) if entropy is None else entropy,
                     tuple(alternatives))


def sampled_estimates(known: list[tuple[bytes, float | None]], temperature: float, top_k: int) -> dict[bytes, float]:
    """Each known token's probability under the distribution sampled from (temperature, then top-k),
    from the tokens the server reported. Exact for greedy replies and when 0 < top_k <= the tokens
    sent (the cut then falls inside them); otherwise the tail not sent is missing, and the figures are
    a little high."""
    probs: dict[bytes, float] = {}
    for data, p in known:
        if p is not None:
            probs[data] = max(probs.get(data, 0.0), p)
    ranked = sorted(probs.items(), key=lambda kv: -kv[1])
    if not ranked:
        return {}
    if temperature <= 0:
        return {data: 1.0 if i == 0 else 0.0 for i, (data, _) in enumerate(ranked)}
    kept = ranked[:top_k] if top_k > 0 else ranked
    weights = {data: math.exp(math.log(max(p, 1e-300)) / temperature) for data, p in kept}
    total = sum(weights.values())
    return {data: weights.get(data, 0.0) / total for data, _ in ranked}


def entropy_estimate(top: list[float | None]) -> float:
    """Bits, from the most likely tokens sent and the rest of the mass as one lump: a lower bound of the
    model's entropy (the rest is spread over many tokens)."""
    ps = [p for p in top if p]
    rest = max(0.0, 1.0 - sum(ps))
    return -sum(p * math.log2(p) for p in [*ps, rest] if p > 0)


def _p(logprob: float | str | None) -> float | None:
    if logprob is None:
        return None
    return math.exp(max(float(logprob), -1e4))


