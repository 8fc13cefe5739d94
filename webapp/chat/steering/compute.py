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
from pathlib import Path
from typing import Any

import numpy as np
import torch

from webapp.chat.model import hooked
from webapp.digits import plain_digits

MAX_ALPHA = 1000.0  # |α| beyond this is a typo, not an experiment
MAX_TERMS = 8  # directions one steered run adds at once


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
        if head != "direction" or not dot or not plain_digits(number):
            continue
        found[int(number)] = np.array(tensor.data, dtype=np.float32).reshape(-1)
    if not found:
        raise ValueError("no direction.N tensors: not a llama.cpp control vector")
    return found
