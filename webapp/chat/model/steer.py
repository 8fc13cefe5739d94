"""A steered run's edit: directions added to the residual stream and features clamped, as every experiment's run
and every reply honours them (webapp/chat/model/edits.py: ResidAdd, ResidClamp). Made here once from the terms a
steered version ran with (webapp/chat/directions.py terms_of); how a direction is made is the steering
package's (webapp/chat/steering/compute.py).

Shapes: C n_embd, N positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from webapp.chat.model.edits import Edit, ResidAdd, ResidClamp


@dataclass(frozen=True)
class Term:
    """One direction added to a run: α · vector after block `layer` (0-based). Compared and hashed by value,
    so a request that carries terms finds the kept result of the same steering."""

    layer: int
    vector: tuple[float, ...]  # (C,)
    alpha: float


@dataclass(frozen=True)
class ClampTerm:
    """Feature `feature` of the model's dictionary `dictionary` (read after block `layer`) set to `value` at
    every position, the dictionary's reconstruction error kept (Templeton et al. 2024)."""

    layer: int
    dictionary: str
    feature: int
    value: float


def steer_edit(terms: Sequence[Term], device: torch.device | str, dtype: torch.dtype) -> Edit:
    """The Edit that adds each term's α · v after its block, in the model's dtype and on its device (the
    product taken in float32)."""
    return Edit(adds=tuple(ResidAdd(t.layer, (torch.tensor(t.vector, dtype=torch.float32) * t.alpha)
                                    .to(device=device, dtype=dtype)) for t in terms))


def steer_edit_of(loaded: Any, terms: Sequence[Term | ClampTerm]) -> Edit | None:
    """The Edit of a steered run on a loaded model (its dictionaries give the clamped features), in the
    model's activations' dtype and on its device; None for no terms (the model's own run). Raises KeyError
    for a dictionary the model has not loaded."""
    if not terms:
        return None
    weight = loaded.model.transformer.wte.weight  # the activations' dtype (lm_head may hold int8 weights)
    added = steer_edit([t for t in terms if isinstance(t, Term)], weight.device, weight.dtype)
    clamps = []
    for t in terms:
        if isinstance(t, ClampTerm):
            sae = loaded.dictionaries[t.dictionary].sae
            clamps.append(ResidClamp(t.layer, sae.W_dec[t.feature].detach(), t.value, FeatureActivation(sae, t.feature),
                                     f"{t.dictionary}/{t.feature}"))
    return Edit(adds=added.adds, clamps=tuple(clamps))


class FeatureActivation:
    """x (N, C) -> (N,): one feature's activation under its dictionary's encode."""

    def __init__(self, sae: Any, feature: int) -> None:
        self.sae, self.feature = sae, feature

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        found: torch.Tensor = self.sae.encode(x)[:, self.feature]
        return found
