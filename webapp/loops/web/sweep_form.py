"""The sweep form on the Loop-lab page: its fields as typed, and the JSON value the API takes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from webapp.loops.sweep import FAMILIES, parse_k_text

FAMILY_LABELS = {"function": "Random function", "permutation": "Random permutation", "cycle": "One 26-cycle",
                 "cycle_tail": "Short cycle + tail", "identity": "Identity"}


@dataclass
class SweepForm:
    model: str = "main"
    compare: str = ""  # a second model on the same tables; empty: none
    family: str = "function"
    k: str = "1,2,4,8,16,32"
    tables: str = "10"
    seed: str = "1"
    errors: dict = field(default_factory=dict)

    @classmethod
    def default(cls, models: list[dict]) -> SweepForm:
        names = [m["name"] for m in models]
        return cls(model=names[0] if names else "main", compare=names[1] if len(names) > 1 else "")

    @classmethod
    def from_form(cls, form) -> SweepForm:
        def text(name: str) -> str:
            return str(form.get(name, ""))[:200]
        return cls(model=text("model"), compare=text("compare"), family=text("family"), k=text("k"),
                   tables=text("tables"), seed=text("seed"))

    def as_value(self) -> dict:
        models = [self.model] + ([self.compare] if self.compare and self.compare != self.model else [])
        return {"model": models, "family": self.family, "k": parse_k_text(self.k),
                "tables": _number(self.tables), "seed": _number(self.seed)}


def _number(text: str):
    text = text.strip()
    return int(text) if re.fullmatch(r"[0-9]{1,12}", text) else text


__all__ = ["FAMILIES", "FAMILY_LABELS", "SweepForm"]
