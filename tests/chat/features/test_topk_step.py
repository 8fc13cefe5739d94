"""A TopK training step worked out on the chosen features only (webapp/chat/features/topk_step.py) gives the loss and
every parameter's gradient of the dense computation written out by hand (every feature's activation, z @ W_dec,
AuxK over a dense mask), with and without dead features, with and without b_dec subtracted from the input."""

from __future__ import annotations

import pytest
import torch

from webapp.chat.features.sae import Dictionary, DictionaryConfig
from webapp.chat.features.topk_step import choose, losses


def dense_loss(sae: Dictionary, x: torch.Tensor, dead: torch.Tensor, k_aux: int, aux_weight: float) -> torch.Tensor:
    """Gao et al.'s TopK loss as the papers write it: dense activations, a dense decoder, AuxK on a masked copy."""
    inputs = (x - sae.b_dec) if sae.config.apply_b_dec_to_input else x
    pre = inputs @ sae.W_enc + sae.b_enc
    top = torch.relu(pre).topk(sae.config.k, dim=-1)
    z = torch.zeros_like(pre).scatter(-1, top.indices, top.values)
    x_hat = z @ sae.W_dec + sae.b_dec
    loss = ((x_hat - x) ** 2).sum(-1).mean() / ((x - x.mean(0)) ** 2).sum(-1).mean()
    if dead.any():
        masked = torch.where(dead, torch.relu(pre), torch.zeros_like(pre))
        aux = masked.topk(min(k_aux, int(dead.sum())), dim=-1)
        z_aux = torch.zeros_like(pre).scatter(-1, aux.indices, aux.values)
        residual = x - x_hat.detach()
        aux_loss = ((z_aux @ sae.W_dec - residual) ** 2).sum(-1).mean() / (residual ** 2).sum(-1).mean()
        loss = loss + aux_weight * aux_loss
    return loss


def gradients(sae: Dictionary, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    sae.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad.clone() for name, p in sae.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("n_dead", [0, 5, 40])
@pytest.mark.parametrize("subtract_b_dec", [True, False])
@pytest.mark.parametrize("b_enc_mean", [0.0, -2.0])  # -2: most rows have fewer than k positive pre-activations
def test_the_sparse_step_gives_the_dense_loss_and_gradients(n_dead, subtract_b_dec, b_enc_mean):
    torch.manual_seed(n_dead)
    sae = Dictionary(DictionaryConfig(d_in=16, d_sae=64, architecture="topk", k=4,
                                      apply_b_dec_to_input=subtract_b_dec))
    with torch.no_grad():
        sae.b_dec.normal_(0, 0.3)
        sae.b_enc.normal_(b_enc_mean, 0.1)
    x = torch.randn(32, 16)
    dead = torch.zeros(64, dtype=torch.bool)
    dead[torch.randperm(64)[:n_dead]] = True
    expected = dense_loss(sae, x, dead, 8, 1 / 32)
    want = gradients(sae, expected)
    loss, error = losses(sae, x, choose(sae, x), dead, 8, 1 / 32)
    got = gradients(sae, loss)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert set(got) == set(want) == {"W_enc", "b_enc", "W_dec", "b_dec"}
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-4, atol=1e-6), name
    assert want["W_enc"].abs().sum() > 0 and error.shape == (32,)
    if b_enc_mean < 0:  # the case where relu-then-topk and topk-then-relu could part: fewer than k positive
        inputs = (x - sae.b_dec) if subtract_b_dec else x
        assert ((inputs @ sae.W_enc + sae.b_enc > 0).sum(-1) < 4).any()
    if n_dead:  # AuxK is in the loss compared
        assert expected.item() > dense_loss(sae, x, torch.zeros(64, dtype=torch.bool), 8, 1 / 32).item()
