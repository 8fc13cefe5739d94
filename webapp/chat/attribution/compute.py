"""Direct logit attribution at one position: the chosen token's logit split into what each part of the
model wrote into the residual stream there.

The final residual at position p is a sum of parts (nanoGPT's forward; webapp/chat/inside/compute.py
keeps each of them at p):

    x_n = e + Σ_l Σ_h y_lh W_lhᵀ + Σ_l m_l + Σ_l (b_l + d_l)
          e = wte[id] + wpe[p]          the embeddings
          y_lh W_lhᵀ                    head h of block l: its output (hs,) through its hs columns of c_proj
          m_l                           block l's MLP output, less its c_proj bias d_l
          b_l, d_l                      attention's and the MLP's c_proj biases

ln_f is linear once its scale is frozen at its value at p, σ = √(var(x_n) + eps), and centring is linear
(the centred parts sum to the centred residual), so with u = W_U[t] (lm_head's row of the token t):

    logit_t = u · ln_f(x_n) = Σ_parts u · (γ ⊙ (part − mean(part)) / σ)  +  u · β

exactly, up to float rounding. Against a token a, u = W_U[t] − W_U[a]: the logit difference. "biases"
gathers every c_proj bias and β (and lm_head's bias, where a model has one). Each reading is worked out as
part · r with r = γ ⊙ u / σ less its mean (the same number: centring is self-adjoint), so a head costs one
pass over c_proj (y_lh · (W_lhᵀ r)) and never a (C,) vector of its own.

The forward runs at the model's precision; the split is worked out in float32 from its activations and
its stored weights (int8 ones times their scales). At float32 the parts add up to the logit to float
rounding; at a reduced precision, to that precision's rounding of c_proj's products.

Shapes: L n_layer, nh heads, hs = C // nh, C n_embd.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from webapp.chat.inside.compute import Inside


@dataclass
class Attribution:
    """The measured quantity (the token's logit, or its difference to `against`) and its parts."""

    logit: float  # the model's own: u · ln_f(x_n), lm_head's bias included
    embed: float
    heads: torch.Tensor  # (L, nh) float32
    mlps: torch.Tensor  # (L,) float32
    biases: float

    def total(self) -> float:
        """The parts added up: equals `logit` (to float rounding)."""
        return self.embed + float(self.heads.double().sum()) + float(self.mlps.double().sum()) + self.biases


def dense_weight(linear: Any, rows: Any = slice(None)) -> torch.Tensor:
    """Some rows of a linear layer's weight (out, in) as float32: int8 weights times their per-row scale."""
    weight: torch.Tensor = linear.weight[rows].float()
    scale = getattr(linear, "scale", None)
    return weight if scale is None else weight * scale[rows].float().unsqueeze(-1)


def _bias(module: nn.Module | None, size: int, device: torch.device) -> torch.Tensor:
    bias = getattr(module, "bias", None)
    return torch.zeros(size, device=device) if bias is None else bias.float()


@torch.inference_mode()
def attribute(model: Any, inside: Inside, token: int, against: int | None = None) -> Attribution:
    """Split the logit of `token` (minus that of `against`) at the position look_inside ran up to."""
    C, nh = model.config.n_embd, model.config.n_head
    hs = C // nh
    blocks = list(model.transformer.h)
    ln_f, lm_head = model.transformer.ln_f, model.lm_head
    device = inside.residuals.device
    rows = [token] if against is None else [token, against]
    w_u = dense_weight(lm_head, rows)  # (1 or 2, C)
    b_u = _bias(lm_head, lm_head.weight.size(0), device)[rows]  # (1 or 2,)
    u = w_u[0] if against is None else w_u[0] - w_u[1]  # (C,): the direction the logit reads
    lm_bias = float(b_u[0] if against is None else b_u[0] - b_u[1])

    # ln_f with its scale frozen at p, then u: centring is self-adjoint, so a part's reading,
    # (γ ⊙ (part − mean(part)) / σ) · u, is part · r with r = γ ⊙ u / σ, centred
    x_n = inside.residuals[-1].float()
    sigma = torch.sqrt(x_n.var(unbiased=False) + ln_f.eps)
    gamma = torch.ones(C, device=device) if ln_f.weight is None else ln_f.weight.float()
    r = gamma * u / sigma
    r = r - r.mean()  # (C,)

    # a head's part is y_lh W_lhᵀ: read as y_lh · (W_lhᵀ r), one pass over each c_proj
    heads = torch.stack([(inside.heads[layer].float() * (r @ dense_weight(block.attn.c_proj)).view(nh, hs)).sum(-1)
                         for layer, block in enumerate(blocks)])  # (L, nh)
    mlp_biases = torch.stack([_bias(getattr(block.mlp, "c_proj", None), C, device) for block in blocks])  # (L, C)
    mlps = (inside.mlps.float() - mlp_biases) @ r  # (L,)
    biases = sum((_bias(block.attn.c_proj, C, device) for block in blocks), mlp_biases.sum(0))  # (C,)
    embed = inside.residuals[0].float() @ r  # wte[id] + wpe[p]
    beta = float(_bias(ln_f, C, device) @ u)

    logit = float(ln_f(inside.residuals[-1]).float() @ u) + lm_bias  # the model's logit (difference)
    return Attribution(logit=logit, embed=float(embed), heads=heads.cpu(), mlps=mlps.cpu(),
                       biases=float(biases @ r) + beta + lm_bias)
