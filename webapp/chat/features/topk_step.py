"""One training step's losses of a TopK dictionary, worked out on the features each row uses, not on all of them.

A row's reconstruction reads k of d_sae features, and AuxK at most k_aux dead ones, so its gradient reaches only
those encoder columns and decoder rows. The encoder's pre-activations are computed densely once (every feature's,
to choose the k largest), without autograd; the chosen ones are then handed to autograd through EncodeAt, whose
backward is a sparse product (the chosen (row, feature) pairs times the rows); the decoder runs as an embedding
bag (the chosen rows of W_dec, weighted by the activations). Gradients are the dense computation's (tests/chat/
features/test_topk_step.py checks them against it by hand), at a fraction of its multiply-adds: the dense step
multiplies every row by all of W_enc and W_dec forward and backward, for the losses and AuxK alike.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from webapp.chat.features.sae import Dictionary


class EncodeAt(torch.autograd.Function):
    """Chosen pre-activations (N, m), already computed, as a function of W_enc, b_enc and b_dec: the forward hands
    them on; the backward gives each parameter the gradient of W_encᵀ (x − b_dec) + b_enc at those features only."""

    @staticmethod
    def forward(ctx: Any, chosen: Tensor, inputs: Tensor, W_enc: Tensor, b_enc: Tensor, b_dec: Tensor,
                indices: Tensor) -> Tensor:
        ctx.save_for_backward(inputs, W_enc, indices)
        return chosen.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, None, Tensor, Tensor, Tensor, None]:
        inputs, W_enc, indices = ctx.saved_tensors  # inputs: x − b_dec (or x), (N, d_in)
        n, m = indices.shape
        d_sae = W_enc.size(1)
        rows = torch.arange(n, device=grad.device).repeat_interleave(m)
        pairs = torch.sparse_coo_tensor(torch.stack([indices.reshape(-1), rows]), grad.reshape(-1), (d_sae, n),
                                        check_invariants=False)  # indices in range by construction
        grad_W_enc = torch.sparse.mm(pairs, inputs).t().contiguous()  # (d_in, d_sae)
        grad_b_enc = torch.zeros(d_sae, dtype=grad.dtype, device=grad.device).index_add_(
            0, indices.reshape(-1), grad.reshape(-1))
        return None, None, grad_W_enc, grad_b_enc, -(W_enc @ grad_b_enc), None


def encode_at(sae: Dictionary, inputs: Tensor, pre: Tensor, indices: Tensor) -> Tensor:
    """The activations of the chosen features (N, m), differentiable in the encoder's parameters."""
    b_dec = sae.b_dec if sae.config.apply_b_dec_to_input else sae.b_dec.detach()
    chosen = EncodeAt.apply(pre.gather(-1, indices), inputs, sae.W_enc, sae.b_enc, b_dec, indices)  # type: ignore[no-untyped-call]
    return torch.relu(chosen)


def decode_at(sae: Dictionary, indices: Tensor, activations: Tensor) -> Tensor:
    """Σ activation × W_dec row over each row's chosen features (N, d_in), without b_dec."""
    return F.embedding_bag(indices, sae.W_dec, per_sample_weights=activations, mode="sum")


@torch.no_grad()
def choose(sae: Dictionary, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """x (N, d_in) -> (the encoder's inputs (N, d_in), every feature's pre-activation (N, d_sae), the k features
    each row uses (N, k): the k largest, as relu then topk would choose among the positive)."""
    inputs = (x - sae.b_dec) if sae.config.apply_b_dec_to_input else x
    pre = inputs @ sae.W_enc + sae.b_enc
    return inputs, pre, pre.topk(min(sae.config.k, pre.size(-1)), dim=-1).indices


def losses(sae: Dictionary, x: Tensor, chosen: tuple[Tensor, Tensor, Tensor], dead: Tensor, k_aux: int,
           aux_weight: float) -> tuple[Tensor, Tensor]:
    """x (N, d_in), what choose() chose, dead (d_sae,) -> (the loss to differentiate, each row's squared error
    (N,)). The loss: the normalised MSE, plus `aux_weight` × Gao et al.'s AuxK (the k_aux largest pre-activations
    of the dead features reconstruct the error x − x̂; its MSE over the error's own; 0 when no feature is dead)."""
    inputs, pre, indices = chosen
    x_hat = decode_at(sae, indices, encode_at(sae, inputs, pre, indices)) + sae.b_dec
    error = ((x_hat - x) ** 2).sum(-1)
    total = ((x - x.mean(0)) ** 2).sum(-1)
    loss = error.mean() / total.mean().clamp_min(1e-8)
    n_dead = int(dead.sum())
    if n_dead:
        with torch.no_grad():
            aux = pre.masked_fill(~dead, float("-inf")).topk(min(k_aux, n_dead), dim=-1).indices
        residual = x - x_hat.detach()
        residual_hat = decode_at(sae, aux, encode_at(sae, inputs, pre, aux))
        aux_loss = ((residual_hat - residual) ** 2).sum(-1).mean() / (residual ** 2).sum(-1).mean().clamp_min(1e-8)
        loss = loss + aux_loss * aux_weight
    return loss, error.detach()
