"""A sparse dictionary of a model's residual stream: a sparse autoencoder (SAE), in SAELens's parameter layout.

    z = σ(W_encᵀ (x − b_dec) + b_enc)          (d_sae,) feature activations; W_enc is (d_in, d_sae)
    x̂ = W_decᵀ z + b_dec                       (d_in,) the reconstruction; W_dec is (d_sae, d_in)

σ by architecture (SAELens's names):
    "topk"      TopK(ReLU(·)): the k largest pre-activations kept, the rest 0 (Gao et al. 2024)
    "standard"  ReLU(·)
    "jumprelu"  pre · [pre > θ], one threshold θ per feature (Rajamanoharan et al. 2024)

Training keeps the decoder's rows at unit norm (so a feature's activation is its size in the stream) and adds
the AuxK loss of Gao et al.: the k_aux largest pre-activations of the features dead for a while reconstruct
the residual error, so dead features get a gradient again.

Shapes: N rows of activations, d_in the model's width (C), d_sae the dictionary's width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch import Tensor

ARCHITECTURES = ("topk", "standard", "jumprelu")


@dataclass(frozen=True)
class DictionaryConfig:
    """What SAELens's cfg.json says of a dictionary (webapp/chat/features/saelens.py reads and writes it)."""

    d_in: int
    d_sae: int
    architecture: str = "topk"
    k: int = 32  # topk only
    layer: int = 0  # read after this block (0-based): hook_name blocks.{layer}.hook_resid_post
    apply_b_dec_to_input: bool = True  # SAELens's: whether the encoder reads x − b_dec or x
    model_name: str = ""  # the model it was trained on (the registry's name), for people
    extra: dict[str, object] = field(default_factory=dict)  # whatever else the file said, kept as read

    @property
    def hook_name(self) -> str:
        return f"blocks.{self.layer}.hook_resid_post"


class Dictionary(nn.Module):
    def __init__(self, config: DictionaryConfig) -> None:
        super().__init__()
        if config.architecture not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {config.architecture!r}: Glassbox reads {', '.join(ARCHITECTURES)}")
        self.config = config
        self.W_enc = nn.Parameter(torch.empty(config.d_in, config.d_sae))
        self.b_enc = nn.Parameter(torch.zeros(config.d_sae))
        self.W_dec = nn.Parameter(torch.empty(config.d_sae, config.d_in))
        self.b_dec = nn.Parameter(torch.zeros(config.d_in))
        self.threshold = nn.Parameter(torch.zeros(config.d_sae), requires_grad=False)  # jumprelu only
        nn.init.kaiming_uniform_(self.W_dec)
        self.normalize_decoder()
        with torch.no_grad():
            self.W_enc.copy_(self.W_dec.T)  # the encoder starts as the decoder's transpose (Gao et al.)

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        self.W_dec.div_(self.W_dec.norm(dim=1, keepdim=True).clamp_min(1e-8))

    def pre_activations(self, x: Tensor) -> Tensor:
        """x (N, d_in) -> (N, d_sae): W_encᵀ (x − b_dec) + b_enc (x itself where the file says not to subtract)."""
        return ((x - self.b_dec) if self.config.apply_b_dec_to_input else x) @ self.W_enc + self.b_enc

    def activate(self, pre: Tensor) -> Tensor:
        """Pre-activations -> feature activations, by the dictionary's architecture."""
        arch = self.config.architecture
        if arch == "topk":
            top = torch.relu(pre).topk(min(self.config.k, pre.size(-1)), dim=-1)
            return torch.zeros_like(pre).scatter_(-1, top.indices, top.values)
        if arch == "jumprelu":
            return pre * (pre > self.threshold)
        return torch.relu(pre)

    def encode(self, x: Tensor) -> Tensor:
        """x (N, d_in) -> z (N, d_sae)."""
        return self.activate(self.pre_activations(x))

    def strongest(self, pre: Tensor, n: int) -> tuple[Tensor, Tensor]:
        """Pre-activations (N, d_sae) -> the n largest activations of each row and their features, each (N, n'),
        largest first (n' = min(n, k) for topk): what encode() then topk would give, without the dense result.
        Entries past a row's active features are 0."""
        arch = self.config.architecture
        if arch == "topk":
            return torch.relu(pre).topk(min(n, self.config.k, pre.size(-1)), dim=-1)
        return self.activate(pre).topk(min(n, pre.size(-1)), dim=-1)

    def decode(self, z: Tensor) -> Tensor:
        """z (N, d_sae) -> x̂ (N, d_in)."""
        return z @ self.W_dec + self.b_dec

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        z = self.encode(x)
        return z, self.decode(z)


@torch.no_grad()
def remove_parallel_gradient(sae: Dictionary) -> None:
    """Drop the part of W_dec's gradient that would change its rows' norms (they stay at 1)."""
    grad = sae.W_dec.grad
    if grad is not None:
        grad -= (grad * sae.W_dec).sum(-1, keepdim=True) * sae.W_dec
