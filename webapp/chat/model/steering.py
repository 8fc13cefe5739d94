"""Steering: directions in the residual stream, and what adding them does.

A direction v (C,) is added, times a strength α, to the residual stream after block L at every position,
prompt and reply alike (activation addition, Turner et al. 2023; the convention of llama.cpp's control
vectors and of repeng): an Edit with a ResidAdd (webapp/chat/model/edits.py), which the hooked forward and
the serving paths (prefill, the batched decode step) honour alike.

A contrastive direction (CAA, Rimsky et al. 2024) is the mean difference of the residual stream after block
L between two lists of prompts, each read at its last position, through the hooked forward:

    v = mean_i resid_post_L(positive_i)[-1] - mean_j resid_post_L(negative_j)[-1]

llama.cpp's control vector file is a GGUF with one float32 tensor `direction.N` of the model's width per
block N, added to that block's output (block N counted from 0, as here; llama.cpp has no slot for block 0).

Shapes: C n_embd, T a prompt's positions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from webapp.chat.model import hooked
from webapp.chat.model.edits import Edit, ResidAdd, ResidClamp

MAX_ALPHA = 1000.0  # |α| beyond this is a typo, not an experiment
MAX_TERMS = 8  # directions one steered run adds at once


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


@torch.inference_mode()
def last_residuals(model: Any, prompts: Sequence[Sequence[int]], layer: int,
                   between: Callable[[], None] | None = None) -> torch.Tensor:
    """Each prompt's residual stream after block `layer` at its last position -> (len(prompts), C) float32.
    between: called after each prompt's run."""
    device = model.transformer.wte.weight.device
    rows = []
    for ids in prompts:
        x = hooked.embed(model, torch.tensor([list(ids)], dtype=torch.long, device=device))
        out = hooked.run(model, x, last_layer=layer, reads=hooked.Reads(resid=True, first=len(ids) - 1,
                                                                         layers=frozenset({layer + 1})))
        rows.append(out.resid[layer + 1][0, -1].float())
        if between is not None:
            between()
    return torch.stack(rows)


def contrastive(model: Any, positive: Sequence[Sequence[int]], negative: Sequence[Sequence[int]],
                layer: int, between: Callable[[], None] | None = None, method: str = "mean") -> torch.Tensor:
    """A direction from the residual stream after block `layer` at the prompts' last positions -> (C,) float32 on
    the CPU. "mean": the mean of the positive less the mean of the negative. "pca" (repeng's way): the first
    principal component of the paired differences positive[i] − negative[i] (centred), scaled to the mean
    difference's length along it and signed to point the same way."""
    plus, minus = last_residuals(model, positive, layer, between), last_residuals(model, negative, layer, between)
    mean = plus.mean(0) - minus.mean(0)
    if method == "mean":
        return mean.cpu()
    diffs = plus - minus  # (N, C): the pairs, in order
    vh: torch.Tensor = torch.linalg.svd(diffs - diffs.mean(0), full_matrices=False)[2]
    component = vh[0]  # (C,) unit length
    along = float(mean @ component)
    return (component * (along if along != 0 else float(mean.norm()))).cpu()


def write_control_vector(path: Path, directions: dict[int, np.ndarray], model_hint: str) -> None:
    """llama.cpp's control vector: `direction.N` (float32, the model's width) for each block N >= 1."""
    import gguf

    if 0 in directions:
        raise ValueError("llama.cpp's control vectors have no slot for block 0 (it adds direction.N after block "
                         "N from 1 on): a direction after block 0 cannot be exported.")
    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_string("controlvector.model_hint", model_hint)
    writer.add_uint32("controlvector.layer_count", len(directions))
    for layer, vector in sorted(directions.items()):
        writer.add_tensor(f"direction.{layer}", np.ascontiguousarray(vector, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def read_control_vector(path: Path) -> dict[int, np.ndarray]:
    """A llama.cpp control vector's directions by block. Raises ValueError for a file that is not one."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as error:  # gguf raises bare ValueErrors, KeyErrors and struct errors on a bad file
        raise ValueError(f"not a GGUF file ({error})") from None
    found = {}
    for tensor in reader.tensors:
        name = tensor.name
        head, dot, number = name.partition(".")
        if head != "direction" or not dot or not number.isdigit():
            continue
        found[int(number)] = np.array(tensor.data, dtype=np.float32).reshape(-1)
    if not found:
        raise ValueError("no direction.N tensors: not a llama.cpp control vector")
    return found
