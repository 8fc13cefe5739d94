"""The logit lens over a whole reply: every layer's residual at every position that produced a reply token,
read out through the final layer norm and the output layer.

One run of the prompt and the reply through the hooked forward every experiment reads
(webapp/chat/model/hooked.py), keeping the residual stream at the reply's positions after the embeddings
and after every block (the prompt's first positions may come as a kept KV cache's keys and values
instead, as Inside's do):

    logits_l = lm_head(ln_f(x_l))                                       at each kept position

Only the top-1 token, its probability and the written token's probability and rank are kept from the
logits (softmax at temperature 1 over the whole output layer, as the token panel's odds): the output layer
is run on a few rows at a time, so a large vocabulary never needs (n_layer + 1) × T × V floats at once.

Shapes: T tokens run, R reply positions kept, L = n_layer + 1 layers, C n_embd, V the output layer's rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from webapp.chat.model import hooked
from webapp.chat.model.edits import Edit
from webapp.chat.model.hooked import KeysValues

LOGIT_FLOATS = 2**23  # logits worked out at once (32 MiB of float32): rows of the output layer per chunk


@dataclass
class LensGrid:
    """(L, R) each: layer l's most likely token at reply position r, its probability, and the written token's
    probability and rank there (1: the layer's most likely)."""

    top: torch.Tensor  # long
    top_p: torch.Tensor  # float32
    written_p: torch.Tensor  # float32
    written_rank: torch.Tensor  # long


@torch.inference_mode()
def reply_residuals(model: Any, ids: torch.Tensor, first: int, between: Callable[[], None] | None = None,
                    edit: Edit | None = None, start: int = 0, past: KeysValues | None = None) -> torch.Tensor:
    """Run ids (1, T) at positions start..start+T-1 -> the residual stream at positions first.. after the
    embeddings and after each block, (L, start + T - first, C). between: called after each block; edit:
    heads' and MLPs' outputs replaced as in every forward of the model (webapp/chat/model/edits.py); past:
    the keys and values of positions 0..start-1 per layer (read, never written), e.g. a reply's kept KV cache
    (a run with the same edit); without it start must be 0. first >= start."""
    if first < start:
        raise ValueError("first >= start: the positions kept must be run")
    out = hooked.run(model, hooked.embed(model, ids, start), start=start, past=past, edits=edit,
                     reads=hooked.Reads(resid=True, first=first), between=between)
    return out.stacked("resid")[:, 0]


@torch.inference_mode()
def lens_grid(model: Any, residuals: torch.Tensor, written: torch.Tensor,
              between: Callable[[], None] | None = None, logit_floats: int = LOGIT_FLOATS) -> LensGrid:
    """residuals (L, R, C) and the written token at each position, written (R,) -> the grid. The output
    layer runs on at most `logit_floats` logits at a time; between: called after each such chunk."""
    L, R, C = residuals.shape
    flat = residuals.reshape(L * R, C)  # layer-major: row l * R + r
    wanted = written.to(flat.device).repeat(L).view(L * R, 1)  # the written token of each row
    V = model.lm_head.weight.size(0)
    rows = max(1, logit_floats // V)
    top, top_p, written_p, written_rank = [], [], [], []
    for start in range(0, L * R, rows):
        logits = model.lm_head(model.transformer.ln_f(flat[start:start + rows])).float()  # (rows, V)
        logz = torch.logsumexp(logits, dim=-1)  # (rows,)
        best, best_id = logits.max(dim=-1)
        mine = logits.gather(-1, wanted[start:start + rows])  # (rows, 1)
        top.append(best_id)
        top_p.append(torch.exp(best - logz))
        written_p.append(torch.exp(mine[:, 0] - logz))
        written_rank.append((logits > mine).sum(-1) + 1)  # ranked as odds.py ranks: strictly greater logits
        if between is not None:
            between()
    return LensGrid(*(torch.cat(parts).view(L, R).cpu() for parts in (top, top_p, written_p, written_rank)))
