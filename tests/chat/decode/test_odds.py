"""Every token's odds, recorded as it is generated, equal the model's own logits at that position."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tests.chat.decode.test_generate import TINY, tiny
from webapp.chat.decode.generate import generate
from webapp.chat.decode.odds import TOP_ALTERNATIVES, TokenOdds, token_odds

LONG = dataclasses.replace(TINY, block_size=256)


def expected(logits: torch.Tensor, token: int, temperature: float, top_k: int):
    """The odds worked out directly and plainly from one position's logits (V,)."""
    p = torch.softmax(logits.double(), -1)
    if temperature == 0:
        q = torch.zeros_like(p)
        q[token] = 1.0
    else:
        scaled = logits.double() / temperature
        if 0 < top_k < logits.numel():
            keep = torch.zeros_like(scaled, dtype=torch.bool)
            keep[torch.topk(logits, top_k).indices] = True
            scaled = scaled.masked_fill(~keep, -math.inf)
        q = torch.softmax(scaled, -1)
    order = torch.argsort(p, descending=True)
    entropy = -(p * p.log()).nan_to_num().sum().item() / math.log(2)
    return p, q, int((p > p[token]).sum()) + 1, entropy, order[:TOP_ALTERNATIVES].tolist()


@pytest.mark.parametrize("kv", [True, False])
@pytest.mark.parametrize("temperature, top_k", [(1.0, 50), (0.7, 5), (1.3, 0), (0.0, 0)])
def test_recorded_odds_equal_a_direct_softmax_of_the_logits(kv, temperature, top_k):
    loaded = tiny(kv=kv, config=LONG, endless=True)
    prompt = [(7 * i) % 256 for i in range(20)]
    pieces = [p for p in generate(loaded, prompt, max_new_tokens=12, temperature=temperature, top_k=top_k,
                                  seed=4, odds=True) if p.token is not None]
    assert len(pieces) == 12
    ids = list(prompt)
    for piece in pieces:
        with torch.inference_mode():
            logits = loaded.model(torch.tensor([ids]))[0][0, -1]
            logits[256:] = -math.inf  # the endless test model's own mask (a forward hook on lm_head)
        p, q, rank, entropy, top = expected(logits, piece.token, temperature, top_k)
        odds = piece.odds
        assert odds.token == piece.token and odds.rank == rank
        assert odds.probability == pytest.approx(p[piece.token].item(), abs=1e-5)
        assert odds.sampled_probability == pytest.approx(q[piece.token].item(), abs=1e-5)
        assert odds.entropy_bits == pytest.approx(entropy, abs=1e-4)
        assert [a[0] for a in odds.alternatives] == top
        for token, pa, qa in odds.alternatives:
            assert pa == pytest.approx(p[token].item(), abs=1e-5) and qa == pytest.approx(q[token].item(), abs=1e-5)
        ids.append(piece.token)


def test_rows_of_a_step_get_their_own_settings():
    torch.manual_seed(0)
    logits = torch.randn(3, 40) * 3
    tokens = torch.tensor([4, 9, 0])
    rows = token_odds(logits, tokens, [1.0, 0.5, 0.0], [0, 3, 7])
    for r, (t, k) in enumerate([(1.0, 0), (0.5, 3), (0.0, 7)]):
        p, q, rank, _, top = expected(logits[r], int(tokens[r]), t, k)
        assert rows[r].sampled_probability == pytest.approx(q[tokens[r]].item(), abs=1e-6)
        assert rows[r].rank == rank and [a[0] for a in rows[r].alternatives] == top
    assert rows[1].sampled_probability == 0.0 or int(tokens[1]) in torch.topk(logits[1], 3).indices.tolist()


def test_compact_rows_round_trip():
    odds = TokenOdds(5, 0.123456, 0.5, 2, 3.21, ((5, 0.123456, 0.5), (7, 0.3, 0.5)))
    again = TokenOdds.from_row(odds.as_row())
    assert again.token == 5 and again.rank == 2 and again.probability == 0.1235
    assert again.alternatives[1] == (7, 0.3, 0.5)
