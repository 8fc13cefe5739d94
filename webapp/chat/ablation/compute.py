"""Switching parts of a GPT off: which heads and MLPs, zeroed or mean-ablated, as an Edit (edits.py).

Definitions (docs/api.md, "Switch parts off"; the tests use these):

- Zero-ablating head h of layer l replaces that head's attention output, softmax(q kᵀ / √hs) v for that
  head before c_proj, by zeros at every position, prompt and reply alike; c_proj and its bias then run
  as usual. A whole attention layer is all of its heads. Zero-ablating an MLP replaces its output (before
  its residual add) by zeros.
- Mean-ablating replaces the part's output, at every position, by its mean over the context's positions:
  the positions 0..T-1 of the ids the run starts from (a reply: its exact prompt; one token of a reply: the
  prompt and the reply's tokens before it), taken from one clean forward of them (nothing edited). The
  means are fixed before the run: the reply's own tokens never change them.

Layers and heads are counted from 0 (`L.H`: block L, head H).

Shapes: T tokens, C n_embd, nh n_head, hs head size (C // nh).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from webapp.chat.model import hooked
from webapp.chat.model.edits import Edit, HeadEdit, MlpEdit

MODES = ("zero", "mean")


@dataclass(frozen=True)
class Parts:
    """What to switch off: heads (layer, head), whole attention layers, MLPs (layer), and how."""

    heads: tuple[tuple[int, int], ...] = ()  # as asked, 0-based
    layers: tuple[int, ...] = ()  # whole attention layers: every head of each
    mlps: tuple[int, ...] = ()
    mode: str = "zero"  # "zero" or "mean"

    def all_heads(self, n_head: int) -> tuple[tuple[int, int], ...]:
        """The heads asked for and every head of the layers asked for, once each, in order."""
        found = set(self.heads) | {(layer, h) for layer in self.layers for h in range(n_head)}
        return tuple(sorted(found))

    def __bool__(self) -> bool:
        return bool(self.heads or self.layers or self.mlps)


def parse_parts(heads: object, layers: object, mlps: object, mode: object, n_layer: int, n_head: int) -> Parts:
    """Parts from a form's or a JSON body's fields: heads "1.0,2.3" (or a list of "L.H"), layers "1" and
    mlps "0,1" (or lists of ints), mode "zero" (the default) or "mean". Raises ValueError naming the first
    bad part (malformed, or a layer or head this model does not have), or saying nothing was chosen."""
    mode = "zero" if mode in (None, "") else mode
    if mode not in MODES:
        raise ValueError(f"mode must be zero or mean, not {str(mode)[:40]!r}.")
    found_heads = []
    for item in _items(heads, "heads"):
        layer_text, dot, head_text = item.partition(".")
        try:
            if not dot:
                raise ValueError
            layer, head = int(layer_text), int(head_text)
        except ValueError:
            raise ValueError(f"{item[:40]!r} is not a head: write layer.head, counted from 0 (e.g. 1.0).") from None
        if not (0 <= layer < n_layer and 0 <= head < n_head):
            raise ValueError(f"There is no head {layer}.{head}: this model has layers 0 to {n_layer - 1}, "
                             f"each with heads 0 to {n_head - 1}.")
        found_heads.append((layer, head))
    found = {}
    for field in ("layers", "mlps"):
        numbers = []
        for item in _items(layers if field == "layers" else mlps, field):
            try:
                number = int(item)
            except ValueError:
                raise ValueError(f"{item[:40]!r} is not a layer number (in {field}): counted from 0, "
                                 "e.g. 1.") from None
            if not 0 <= number < n_layer:
                part = "MLP" if field == "mlps" else "attention layer"
                raise ValueError(f"There is no {part} {number}: this model has layers 0 to {n_layer - 1}.")
            numbers.append(number)
        found[field] = tuple(dict.fromkeys(numbers))
    parts = Parts(tuple(dict.fromkeys(found_heads)), found["layers"], found["mlps"], str(mode))
    if not parts:
        raise ValueError("Choose what to switch off: heads (layer.head, e.g. 1.0), whole attention layers or MLPs.")
    return parts


def _items(value: object, field: str) -> list[str]:
    """A field's items: a string of them separated by commas or spaces, or a list (heads: strings "L.H",
    never numbers, since 1.10 and 1.1 are one number; layers: integers or their strings)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [part for part in re.split(r"[,\s]+", value) if part]
    kinds = (str,) if field == "heads" else (str, int)
    if isinstance(value, list) and all(isinstance(v, kinds) and not isinstance(v, bool) for v in value):
        return [str(v).strip() for v in value]
    what = 'strings "layer.head", e.g. ["1.0", "2.3"]' if field == "heads" else "layer numbers, e.g. [0, 1]"
    raise ValueError(f"{field} must be a comma-separated string or a list of {what}.")


def intervention(parts: Parts, n_head: int) -> dict[str, Any]:
    """What a version's record keeps (and export.json shows): heads as "L.H", MLPs, the mode; the whole
    layers asked for, when there were any (their heads are in `heads` too)."""
    record: dict[str, Any] = {"heads": [f"{layer}.{head}" for layer, head in parts.all_heads(n_head)],
                              "mlps": sorted(parts.mlps), "mode": parts.mode}
    if parts.layers:
        record["layers"] = sorted(parts.layers)
    return record


def zero_edit(parts: Parts, n_head: int) -> Edit:
    return Edit(heads=tuple(HeadEdit(layer, head) for layer, head in parts.all_heads(n_head)),
                mlps=tuple(MlpEdit(layer) for layer in sorted(parts.mlps)))


@dataclass
class CleanRun:
    """One clean forward of a context: the chosen parts' mean outputs over its positions, and the logits
    at its last position."""

    heads: dict[tuple[int, int], torch.Tensor]  # (layer, head) -> (hs,)
    mlps: dict[int, torch.Tensor]  # layer -> (C,)
    logits: torch.Tensor  # (V,) float32

    def mean_edit(self) -> Edit:
        """Each chosen part replaced by its mean at every position."""
        return Edit(heads=tuple(HeadEdit(layer, head, value) for (layer, head), value in sorted(self.heads.items())),
                    mlps=tuple(MlpEdit(layer, value) for layer, value in sorted(self.mlps.items())))


@torch.inference_mode()
def clean_run(model: Any, ids: list[int], parts: Parts, between: Callable[[], None] | None = None) -> CleanRun:
    """One run of ids (positions 0..T-1), nothing edited, through the hooked forward every experiment reads
    (webapp/chat/model/hooked.py), keeping the mean over the T positions of each chosen head's output
    (hook_z: softmax(q kᵀ / √hs, causal) v, before c_proj) and each chosen MLP's output (hook_mlp_out),
    summed in float32 and given back in the activations' dtype, and the logits at the last position.
    between: called after each block."""
    wanted_heads = parts.all_heads(model.config.n_head)
    layers = frozenset(layer for layer, _ in wanted_heads) | frozenset(parts.mlps)
    idx = torch.tensor([ids], dtype=torch.long, device=model.transformer.wte.weight.device)  # (1, T)
    out = hooked.run(model, hooked.embed(model, idx), between=between,
                     reads=hooked.Reads(z=True, mlp_out=True, layers=layers))
    heads = {(layer, head): _mean(out.z[layer][0, head]) for layer, head in wanted_heads}  # (hs,) each
    mlps = {layer: _mean(out.mlp_out[layer][0]) for layer in parts.mlps}  # (C,) each
    logits = model.lm_head(model.transformer.ln_f(out.x[0, -1:]))[0].float()  # (V,)
    return CleanRun(heads, mlps, logits)


def _mean(t: torch.Tensor) -> torch.Tensor:
    """(T, n) -> (n,): the mean over positions, summed in float32, in t's dtype."""
    return t.float().mean(dim=0).to(t.dtype)
