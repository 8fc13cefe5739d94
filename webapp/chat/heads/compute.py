"""One head's attention matrix: the weights of many query positions over every key position, for one block
and head, read from the one hooked forward (webapp/chat/model/hooked.py) run through the chosen block:

    A = softmax(q kᵀ / √hs, causal)   at the chosen block, for head h, at the query rows asked for

Only the rows asked for are kept, and nothing after the chosen block runs. The run is the model's own,
or a steered version's, as Inside's is.

Shapes: T tokens run, S = start + T positions attended (keys), R = start + T - first query rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from webapp.chat.model import hooked
from webapp.chat.model.edits import Edit
from webapp.chat.model.hooked import KeysValues


@torch.inference_mode()
def head_attention(model: Any, ids: torch.Tensor, layer: int, head: int, first: int, start: int = 0,
                   past: KeysValues | None = None, between: Callable[[], None] | None = None,
                   edit: Edit | None = None) -> torch.Tensor:
    """Run ids (1, T) at positions start..start+T-1 through blocks 0..layer (0-based) -> (R, S) float32:
    head `head`'s attention weights of the query positions first..start+T-1 over positions 0..start+T-1
    (each row sums to 1; zero after the query, causal). past: keys and values of positions 0..start-1 per
    layer (read, never written); start <= first. between: called after each block run whole. edit: the run's
    (a steered version's directions), as every forward of the model takes it."""
    S = start + ids.size(1)
    if not start <= first < S:
        raise ValueError(f"query rows must start within the positions run ({start}..{S - 1}), not at {first}")
    n_layer = len(model.transformer.h)
    if not 0 <= layer < n_layer:
        raise ValueError(f"no block {layer}: the model has {n_layer}")
    reads = hooked.Reads(pattern=True, first=first, layers=frozenset({layer}))
    out = hooked.run(model, hooked.embed(model, ids, start), start=start, past=past, last_layer=layer, edits=edit,
                     reads=reads, between=between)
    return out.pattern[layer][0, head]
