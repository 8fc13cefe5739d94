"""What the model thought when it picked each token: the raw material of the glass-box chat.

For every generated token: its probability under the model (softmax of the logits at temperature 1),
under the distribution it was actually drawn from (after temperature and top-k), its rank among all
tokens, the entropy of the model's distribution, and the TOP_ALTERNATIVES most likely tokens with both
probabilities. Computed for all rows of a decoding step at once, from the logits that sampled them:
one top-k and one copy to the host per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

TOP_ALTERNATIVES = 10
_LN2 = math.log(2)


@dataclass(frozen=True)
class TokenOdds:
    token: int
    probability: float | None  # under the model, at temperature 1 (None: typed by a person, not sampled)
    sampled_probability: float | None  # under the distribution sampled from; greedy: 1 for its pick
    rank: int | None  # 1: the model's most likely token
    entropy_bits: float | None  # of the model's distribution
    alternatives: tuple[tuple[int, float, float], ...]  # (id, probability, sampled probability), most likely first

    @classmethod
    def given(cls, token: int) -> TokenOdds:
        """A token a person typed into a branch: it has an id but no odds of its own."""
        return cls(token, None, None, None, None, ())

    @property
    def typed(self) -> bool:
        return self.probability is None

    def as_row(self) -> list[Any]:
        """Compact JSON for storage: [id, p, p_sampled, rank, entropy, [[id, p, p_sampled], ...]]."""
        return [self.token, _r(self.probability), _r(self.sampled_probability), self.rank, _r(self.entropy_bits),
                [[i, _r(p), _r(q)] for i, p, q in self.alternatives]]

    @classmethod
    def from_row(cls, row: list[Any]) -> TokenOdds:
        token, p, q, rank, entropy, alts = row
        return cls(token, p, q, rank, entropy, tuple((i, a, b) for i, a, b in alts))


def _r(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.4g}")  # four significant digits: what a bar can show


def token_odds(logits: torch.Tensor, tokens: torch.Tensor, temperatures: list[float],
               top_ks: list[int]) -> list[TokenOdds]:
    """logits (B, V) that sampled tokens (B,), each row with its own temperature and top-k.

    Three passes over the vocabulary (logsumexp, the entropy's sum, the rank's count) and one top-k;
    the sampled distribution is worked out on the top-k alone (it is zero elsewhere), except for the
    rows that sample from the whole vocabulary."""
    logits = logits.float()
    B, V = logits.shape
    device = logits.device
    logz = torch.logsumexp(logits, dim=-1, keepdim=True)  # (B, 1)
    entropy = (logz.squeeze(-1) - (torch.softmax(logits, dim=-1) * logits.nan_to_num(neginf=0.0)).sum(-1)) / _LN2
    ks = [k if 0 < k < V else V for k in top_ks]
    k_max = min(V, max([TOP_ALTERNATIVES, *[k for k in ks if k < V]]))
    top_logits, top_ids = logits.topk(k_max, dim=-1)  # (B, k_max): the one top-k of the step
    chosen = tokens.view(B, 1)
    chosen_logit = logits.gather(-1, chosen)
    rank = (logits > chosen_logit).sum(-1) + 1  # (B,)

    # the sampled distribution: temperature, then only the top-k (0 or >= V: every token)
    t = torch.tensor([x if x > 0 else 1.0 for x in temperatures], device=device).view(B, 1)
    in_top = torch.arange(k_max, device=device).view(1, k_max) < torch.tensor(ks, device=device).view(B, 1)
    log_q_norm = torch.logsumexp(torch.where(in_top, top_logits / t, -math.inf), dim=-1, keepdim=True)  # (B, 1)
    whole = [r for r, k in enumerate(ks) if k >= V]
    if whole:
        log_q_norm[whole] = torch.logsumexp(logits[whole] / t[whole], dim=-1, keepdim=True)
    floor = top_logits.gather(-1, (torch.tensor([min(k, k_max) for k in ks], device=device) - 1).view(B, 1))
    floor[whole] = -math.inf
    alt_ids = top_ids[:, :TOP_ALTERNATIVES]
    ids = torch.cat([chosen, alt_ids], dim=-1)  # (B, 1 + N): the pick, then the alternatives
    id_logits = torch.cat([chosen_logit, top_logits[:, :TOP_ALTERNATIVES]], dim=-1)
    p = (id_logits - logz).exp()
    q = torch.where(id_logits >= floor, (id_logits / t - log_q_norm).exp(), torch.zeros_like(id_logits))
    greedy = torch.tensor([x == 0 for x in temperatures], device=device).view(B, 1)
    q = torch.where(greedy, (ids == chosen).float(), q)
    table = torch.cat([p, q, rank.view(B, 1).float(), entropy.view(B, 1), ids.float()], dim=-1)
    rows = table.double().tolist()  # the one copy to the host
    n = ids.size(1)
    out = []
    for row in rows:
        ps, qs, (rk, ent), idx = row[:n], row[n:2 * n], row[2 * n:2 * n + 2], row[2 * n + 2:]
        out.append(TokenOdds(int(idx[0]), ps[0], qs[0], int(rk), ent,
                             tuple((int(i), a, b) for i, a, b in zip(idx[1:], ps[1:], qs[1:]))))
    return out
