"""What a version of a reply changed in the model, read from its record (`messages.intervention`, the shape
export.json shows): one tagged union, so a new kind of intervention is taught here once.

    Ablation   parts switched off: {"heads": ["1.0"], "mlps": [1], "mode": "zero"|"mean", "layers"?: [0]}
               (the records written before there were other kinds have no "kind"; "kind": "ablate" reads alike)
    Steering   directions added, features clamped: {"kind": "steer", "directions": [{"direction", "layer", "alpha",
               "norm"}], "clamps": [{"dictionary", "feature", "layer", "value"}]} ("clamps" only when there are some)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ablation:
    record: dict[str, Any]  # as saved: webapp/chat/ablation/compute.intervention

    def label(self) -> str:
        """"heads 1.0, 2.3 zeroed", "attention layer 1 and MLP 0 mean-ablated"."""
        return describe(self.record)


@dataclass(frozen=True)
class SteerTerm:
    direction: str
    layer: int  # added after this block (0-based)
    alpha: float
    norm: float  # the direction's norm: α · norm is how far the stream is pushed


@dataclass(frozen=True)
class Clamp:
    dictionary: str
    feature: int
    layer: int  # the dictionary's block
    value: float  # the activation it is set to


@dataclass(frozen=True)
class Steering:
    terms: tuple[SteerTerm, ...]
    clamps: tuple[Clamp, ...] = ()

    def label(self) -> str:
        """"steered: france ×8 after block 2, feature resid-2/5 clamped to 10"."""
        return "steered: " + ", ".join([f"{t.direction} ×{t.alpha:g} after block {t.layer}" for t in self.terms]
                                       + [f"feature {c.dictionary}/{c.feature} clamped to {c.value:g}"
                                          for c in self.clamps])

    @property
    def record(self) -> dict[str, Any]:
        found: dict[str, Any] = {"kind": "steer", "directions": [
            {"direction": t.direction, "layer": t.layer, "alpha": t.alpha, "norm": t.norm} for t in self.terms]}
        if self.clamps:
            found["clamps"] = [{"dictionary": c.dictionary, "feature": c.feature, "layer": c.layer, "value": c.value}
                               for c in self.clamps]
        return found


Intervention = Ablation | Steering


def from_record(record: object) -> Intervention | None:
    """A version's intervention from its record (None: the model's own run). Raises ValueError for a record
    this code did not write."""
    if not record:
        return None
    if not isinstance(record, dict):
        raise ValueError("an intervention record is a JSON object")
    kind = record.get("kind", "ablate")
    if kind == "ablate":
        return Ablation(record)
    if kind == "steer":
        terms, clamps = record.get("directions"), record.get("clamps", [])
        if not isinstance(terms, list) or not isinstance(clamps, list) or not (terms or clamps):
            raise ValueError("a steering record lists its directions")
        try:
            return Steering(tuple(SteerTerm(str(t["direction"]), int(t["layer"]), float(t["alpha"]), float(t["norm"]))
                                  for t in terms),
                            tuple(Clamp(str(c["dictionary"]), int(c["feature"]), int(c["layer"]), float(c["value"]))
                                  for c in clamps))
        except (TypeError, KeyError, ValueError):
            raise ValueError("a steering record's direction is malformed") from None
    raise ValueError(f"unknown kind of intervention {str(kind)[:40]!r}")


def label(record: object) -> str:
    """A version's label from its record ("" for the model's own run; a plain one for a record this code did
    not write)."""
    try:
        found = from_record(record)
        return found.label() if found is not None else ""
    except (TypeError, ValueError, AttributeError):
        return "the model changed"


def describe(record: dict[str, Any]) -> str:
    """A version's label from its record: "heads 1.0, 2.3 zeroed", "attention layer 1 and MLP 0 mean-ablated"."""
    layers = record.get("layers") or []
    heads = [h for h in record.get("heads") or [] if int(str(h).partition(".")[0]) not in layers]
    mlps = record.get("mlps") or []
    named = []
    if layers:
        named.append(("attention layer " if len(layers) == 1 else "attention layers ") + ", ".join(map(str, layers)))
    if heads:
        named.append(("head " if len(heads) == 1 else "heads ") + ", ".join(heads))
    if mlps:
        named.append(("MLP " if len(mlps) == 1 else "MLPs ") + ", ".join(map(str, mlps)))
    what = ", ".join(named[:-1]) + " and " + named[-1] if len(named) > 1 else "".join(named)
    return f"{what} {'mean-ablated' if record.get('mode') == 'mean' else 'zeroed'}"
