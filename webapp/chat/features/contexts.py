"""What each feature of a dictionary does on a corpus: its density (the fraction of tokens it is active on) and
its top contexts (the tokens where it is strongest, a few tokens either side), as a feature page shows them
(Neuronpedia's "top activations"). The corpus runs through the hooked forward a batch of sequences at a time;
only each feature's best few places are kept, never every activation.

Saved beside the dictionary as `glassbox_features.json` (webapp/chat/features/dictionaries.py reads it):
    {"tokens": N, "density": [d_sae floats], "top": [[{"activation", "tokens": [ids], "at": i}, ...] per feature],
     "histogram": {"edges": [HISTOGRAM_BINS + 1 floats], "counts": [[HISTOGRAM_BINS ints] per feature]}}
where `tokens` is the context around the place (its own token at index `at`), and the histogram counts each
feature's activations where it is active, in bins of equal width on a log scale (an activation below the first
edge counts in the first bin, one above the last in the last). Files written before histograms have none.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from webapp.chat.features.sae import Dictionary
from webapp.chat.model import hooked

FILE = "glassbox_features.json"
HISTOGRAM_BINS = 25
HISTOGRAM_DECADES = (-3.0, 2.0)  # log10 of the first and last edges: activations from 0.001 to 100, 5 bins a decade


def histogram_edges() -> list[float]:
    low, high = HISTOGRAM_DECADES
    return [10 ** (low + (high - low) * i / HISTOGRAM_BINS) for i in range(HISTOGRAM_BINS + 1)]


def histogram_bins(values: torch.Tensor) -> torch.Tensor:
    """Each positive activation's bin (0 to HISTOGRAM_BINS - 1), out-of-range ones in the first or last."""
    low, high = HISTOGRAM_DECADES
    at = ((values.double().log10() - low) / (high - low) * HISTOGRAM_BINS).floor()
    return at.clamp(0, HISTOGRAM_BINS - 1).long()


@torch.inference_mode()
def feature_contexts(model: Any, sae: Dictionary, sequences: Iterable[Sequence[int]], top: int = 8,
                     window: int = 6, batch: int = 16) -> dict[str, Any]:
    """Each feature's density and `top` strongest places over the sequences (each [bos, ...], equal lengths
    within a batch), with `window` tokens either side (the start token left out)."""
    layer, d_sae = sae.config.layer, sae.config.d_sae
    device = model.transformer.wte.weight.device
    best = torch.full((d_sae, top), -1.0)  # activations; -1: none yet
    where = torch.zeros((d_sae, top, 2), dtype=torch.long)  # (sequence, position)
    active = torch.zeros(d_sae)
    counts = torch.zeros(d_sae * HISTOGRAM_BINS, dtype=torch.long)  # (feature, bin), flattened
    kept: list[list[int]] = []
    tokens = 0
    rows: list[list[int]] = []
    for seq in [*sequences, None]:
        if seq is not None:
            rows.append(list(seq))
            if len(rows) < batch:
                continue
        if not rows:
            break
        ids = torch.tensor(rows, dtype=torch.long, device=device)
        out = hooked.run(model, hooked.embed(model, ids), last_layer=layer,
                         reads=hooked.Reads(resid=True, layers=frozenset({layer + 1})))
        x = out.resid[layer + 1][:, 1:].float()  # (B, T - 1, C): the start token left out
        T1 = x.size(1)
        z = sae.to(x.device).encode(x.reshape(-1, x.size(-1))).cpu()  # (B (T-1), d_sae)
        on = z > 0
        active += on.sum(0)
        rows_at, features_at = on.nonzero(as_tuple=True)
        counts += torch.bincount(features_at * HISTOGRAM_BINS + histogram_bins(z[rows_at, features_at]),
                                 minlength=d_sae * HISTOGRAM_BINS)
        tokens += z.size(0)
        values, flat = z.T.topk(min(top, z.size(0)), dim=1)  # (d_sae, top) each: rows of z
        first = len(kept)
        found_where = torch.stack([flat // T1 + first, flat % T1 + 1], dim=-1)  # (sequence, position)
        merged = torch.cat([best, values], dim=1)
        merged_where = torch.cat([where, found_where], dim=1)
        best, order = merged.topk(top, dim=1)
        where = merged_where.gather(1, order[..., None].expand(-1, -1, 2))
        kept.extend(rows)
        rows = []
    found: list[list[dict[str, Any]]] = []
    for f in range(d_sae):
        places = []
        for value, (s, p) in zip(best[f].tolist(), where[f].tolist()):
            if value <= 0:
                continue
            lo = max(1, p - window)
            places.append({"activation": float(f"{value:.6g}"), "tokens": kept[s][lo:p + window + 1], "at": p - lo})
        found.append(places)
    density = [float(f"{d:.6g}") for d in (active / max(tokens, 1)).tolist()]  # (a smaller file)
    histogram = {"edges": [float(f"{e:.6g}") for e in histogram_edges()],
                 "counts": counts.view(d_sae, HISTOGRAM_BINS).tolist()}
    return {"tokens": tokens, "density": density, "top": found, "histogram": histogram}


def save(stats: dict[str, Any], folder: Path) -> None:
    (folder / FILE).write_text(json.dumps(stats, separators=(",", ":")))


def load(folder: Path, d_sae: int | None = None) -> dict[str, Any] | None:
    """The saved statistics, or None when there are none, they cannot be read, or they are not of a dictionary of
    `d_sae` features (the page then says so); a histogram not of that shape is left out."""
    try:
        found = json.loads((folder / FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("top"), list) or \
            not isinstance(found.get("density"), list):
        return None
    if d_sae is not None and (len(found["top"]) != d_sae or len(found["density"]) != d_sae):
        return None
    histogram = found.get("histogram")
    counts = histogram.get("counts") if isinstance(histogram, dict) else None
    edges = histogram.get("edges") if isinstance(histogram, dict) else None
    if not isinstance(counts, list) or len(counts) != len(found["top"]) or not isinstance(edges, list) or \
            len(edges) != HISTOGRAM_BINS + 1 or \
            any(not isinstance(row, list) or len(row) != HISTOGRAM_BINS for row in counts):
        found.pop("histogram", None)
    return found
