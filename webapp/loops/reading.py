"""Which rule the loop block read: its attention over the prompt, summed per rule.

At loop t the model should look up the rule of the letter it is on. The loop block attends over the
prompt's characters; a rule owns its source and destination characters (the v1 format,
webapp/loops/task.py: "AQ BZ …", three characters a rule, the space included in neither), and the
rule read is the one with the most attention mass, heads combined (their mean, so still a
distribution over the prompt). Used live (webapp/loops/trace.py), on upload (webapp/loops/recorded.py:
recomputed from the file's weights, never taken from it) and by scripts/eval_loops.py.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from webapp.loops.task import PROMPT_LENGTH

NOT_AVAILABLE = "Attention is not available for this model."
DIGITS = 4  # weights are kept to 4 decimals (each head's still sums to 1 within 1e-3)


def supports_attention(model: Any) -> bool:
    """Only a model that says so is asked for loop_attention (an owner's forward may not take it)."""
    return getattr(model, "supports_loop_attention", False) is True


def supports_state_change(model: Any) -> bool:
    """Only a model that says so is asked for loop_state_change (how much its state moved each loop)."""
    return getattr(model, "supports_state_change", False) is True


def supports_state(model: Any) -> bool:
    """Only a model that says so is asked for loop_state (its state vector after each loop)."""
    return getattr(model, "supports_loop_state", False) is True


def rule_matrix(pairs) -> torch.Tensor:
    """[PROMPT_LENGTH, 26]: 1 where prompt character i belongs to the rule at index r (in prompt order)."""
    matrix = torch.zeros(PROMPT_LENGTH, len(pairs), dtype=torch.float64)
    for r in range(len(pairs)):
        matrix[3 * r, r] = matrix[3 * r + 1, r] = 1.0
    return matrix


def read_rules(pairs, attention: torch.Tensor) -> list[dict]:
    """attention [n, n_head, T] (T = PROMPT_LENGTH) -> per loop {"source", "destination", "mass"}."""
    combined = attention.double().mean(1)                         # [n, T]
    mass = combined @ rule_matrix(pairs)                          # [n, 26]
    best, index = mass.max(-1)
    return [{"source": pairs[r][0], "destination": pairs[r][1], "mass": round(m, DIGITS)}
            for m, r in zip(best.tolist(), index.tolist())]


def read_rules_of(pairs_per_row, attention: torch.Tensor) -> list[dict]:
    """read_rules for rows with rules of their own (one loop of many runs): attention [n, n_head, T]
    and each row's rules. Each row's mass sums only its rule's two characters (the matrix's other
    entries are 0), so it is the same number whatever else is in the batch."""
    combined = attention.double().mean(1)                         # [n, T]
    mass = combined @ rule_matrix(pairs_per_row[0])               # [n, 26]: every prompt has 26 rules
    best, index = mass.max(-1)
    return [{"source": pairs[r][0], "destination": pairs[r][1], "mass": round(m, DIGITS)}
            for pairs, m, r in zip(pairs_per_row, best.tolist(), index.tolist())]


def rounded(attention: torch.Tensor) -> list[list[list[float]]]:
    """[n, n_head, T] -> nested lists to DIGITS decimals (divided in float64, so they print short), a
    weight that rounds to nothing as 0: most do, and "0" keeps a 272-loop trace's file under the upload
    limit (GLASSBOX_MAX_BODY_BYTES), where "0.0" did not."""
    scale = 10 ** DIGITS
    return [[[w or 0 for w in head] for head in row]
            for row in attention.double().mul(scale).round().div(scale).tolist()]


def valid_attention(value: Any) -> bool:
    """A saved row's weights: 1 to 16 heads, each PROMPT_LENGTH finite numbers from 0 to 1."""
    return (isinstance(value, list) and 1 <= len(value) <= 16
            and all(isinstance(head, list) and len(head) == PROMPT_LENGTH and all(
                # compared before isfinite, which cannot take an int past float's range (10**400)
                not isinstance(w, bool) and isinstance(w, (int, float)) and 0 <= w <= 1 and math.isfinite(w)
                for w in head) for head in value))
