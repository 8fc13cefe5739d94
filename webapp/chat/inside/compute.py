"""Inside a GPT at one position: the residual stream after every block, and every head's attention there.

What interpretability notebooks read with forward hooks (TransformerLens, nnsight), read here from the one
hooked forward every experiment runs (webapp/chat/model/hooked.py), kept at the last position p alone:
the stream after the embeddings and after every block (the logit lens reads them through ln_f and
lm_head, as nostalgebraist's "logit lens" does), every head's attention row at p, and what each head and
MLP wrote there (direct logit attribution splits the logit by them). The last block runs at p alone. An
edit (webapp/chat/model/edits.py) changes the run as it changes every forward of the model.

Shapes: T tokens run, S = start + T positions attended (keys), C n_embd, nh heads, hs = C // nh, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from webapp.chat.model import hooked
from webapp.chat.model.edits import Edit
from webapp.chat.model.hooked import KeysValues


@dataclass
class Inside:
    residuals: torch.Tensor  # (n_layer + 1, C): x_0 (embeddings) .. x_n (after the last block), at position p
    attention: torch.Tensor  # (n_layer, nh, S) float32: position p's attention weights over positions 0..p
    heads: torch.Tensor  # (n_layer, nh, hs): each head's output at p (after the edit, before c_proj)
    mlps: torch.Tensor  # (n_layer, C): each MLP's output at p (after the edit, c_proj's bias included)


@torch.inference_mode()
def look_inside(model: Any, ids: torch.Tensor, start: int = 0, past: KeysValues | None = None,
                between: Callable[[], None] | None = None, edit: Edit | None = None) -> Inside:
    """Run ids (1, T) at positions start..start+T-1 and return what happened at the last one, p.

    past: the keys and values of positions 0..start-1, per layer (read, never written), e.g. a reply's
    kept KV cache (one run with the same edit); without it start must be 0. between: called after each
    block (the core lets running replies take a step there). edit: heads' and MLPs' outputs replaced."""
    reads = hooked.Reads(resid=True, z=True, mlp_out=True, pattern=True, first=start + ids.size(1) - 1)
    out = hooked.run(model, hooked.embed(model, ids, start), start=start, past=past, edits=edit, reads=reads,
                     last_only=True, between=between)
    return Inside(residuals=out.stacked("resid")[:, 0, -1], attention=out.stacked("pattern")[:, 0, :, -1],
                  heads=out.stacked("z")[:, 0, :, -1], mlps=out.stacked("mlp_out")[:, 0, -1])


@torch.inference_mode()
def lens_logits(model: Any, residuals: torch.Tensor) -> torch.Tensor:
    """The logit lens: each residual (L, C) through the final layer norm and lm_head -> logits (L, V)."""
    logits: torch.Tensor = model.lm_head(model.transformer.ln_f(residuals))
    return logits
