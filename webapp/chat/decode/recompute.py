"""The owner's generation loop, for models without a KV cache: the whole (cropped) window every step, with the
same Pieces as a Sequence yields (webapp/chat/decode/generate.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Sequence as Seq

import torch

from webapp.chat.decode import sampling
from webapp.chat.decode.odds import TokenOdds, token_odds
from webapp.chat.decode.pieces import GenerationStats, Piece, Pieces, TextDecoder
from webapp.chat.decode.types import SamplingParams, decode_rate
from webapp.chat.model.loading import LoadedChatModel


def generate_recompute(loaded: LoadedChatModel, ids: list[int], params: SamplingParams,
                        should_stop: Callable[[], bool], odds: bool = False, forced: Seq[int] = (),
                        forced_odds: Seq[TokenOdds | None] = ()) -> Pieces:
    """The owner's loop, for models without a KV cache: the whole (cropped) window every step."""
    t0 = time.perf_counter()
    model, tok, block = loaded.model, loaded.tokenizer, loaded.block_size
    device = next(model.parameters()).device
    gen, decoder = sampling.generator(device, params.seed), TextDecoder()
    prompt_tokens, n, t_first, reason = len(ids), 0, None, "length"
    for i, token in enumerate(forced):  # given first tokens, as in Sequence._force
        if tok.is_special(token):
            reason = "end"
            break
        n += 1
        ids.append(token)
        yield Piece(decoder.decode(tok.decode_single_token_bytes(token)), n, 0.0, token=token,
                    odds=forced_odds[i] if i < len(forced_odds) else None, given=True)
    given = n
    while n < params.max_new_tokens and reason != "end":
        if should_stop():
            reason = "cancelled"
            break
        window = torch.tensor([ids[-block:]], dtype=torch.long, device=device)
        with torch.inference_mode():
            logits, _ = model(window)
            next_id = sampling.sample(logits[:, -1, :], params.temperature, params.top_k, gen)
            seen = token_odds(logits[:, -1, :], next_id.view(1), [params.temperature],
                              [params.top_k])[0] if odds else None
        token = int(next_id.item())
        if t_first is None:
            t_first = time.perf_counter() - t0
        if tok.is_special(token):
            reason = "end"
            break
        n += 1
        ids.append(token)
        yield Piece(decoder.decode(tok.decode_single_token_bytes(token)), n, time.perf_counter() - t0,
                    token=token, odds=seen)
        if n == params.max_new_tokens:
            break
    total = time.perf_counter() - t0
    stats = GenerationStats(prompt_tokens, n, t_first, total, decode_rate(n - given, t_first, total), reason, False,
                            0)
    yield Piece(decoder.decode(b"", final=True), n, total, stats)
