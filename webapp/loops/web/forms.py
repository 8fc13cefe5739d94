"""The mapping editor's form: its state, the edits it offers, and turning it into a request.

The editor posts every rule in its current order as parallel `src`/`dst` fields; the
buttons (move up/down, shuffle, presets) are plain submit buttons, so the editor works as
an ordinary HTML form and htmx only saves the page reload.
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass, field

from webapp.digits import plain_digits
from webapp.loops.request import DEFAULT_THRESHOLD, DemoRequest, RequestError
from webapp.loops.task import PRESETS, SYMBOLS, preset, shuffle_rules

# The editor's whole form (26 rules, start, steps, model, an action) is under 2 KiB: a body far over that
# is a script's, refused before it is parsed (webapp/web/bodies.py), and no more rules than the table has
# are ever kept, so neither parsing nor rendering costs more than a real form does.
MAX_FORM_BYTES = 16 * 1024
MAX_RULES = len(SYMBOLS)

PRESET_LABELS = {"cycle": "One 26-cycle", "identity": "Identity", "permutation": "Random permutation",
                 "function": "Random function", "cycle_tail": "Short cycle + tail"}


@dataclass
class EditorState:
    pairs: list[list[str]]
    start: str = "A"
    steps: str = "8"
    errors: dict = field(default_factory=dict)
    model: str = "main"
    extra_rules: int = 0  # rules sent beyond MAX_RULES, dropped (a request with them is refused)
    force_loops: str = ""  # run this many loops whatever the head says ("": until it stops)
    threshold: str = ""  # the head's stop threshold ("": the default)

    @classmethod
    def default(cls, rng: random.Random | None = None) -> EditorState:
        return cls(preset("cycle", rng or random.Random()), "A", "8")

    @classmethod
    def from_form(cls, form) -> EditorState:
        sources, destinations = form.getlist("src"), form.getlist("dst")
        pairs = [[s, d] for s, d in zip(sources[:MAX_RULES], destinations[:MAX_RULES])]
        return cls(pairs, form.get("start", ""), form.get("steps", ""), model=form.get("model", "main"),
                   extra_rules=max(len(sources), len(destinations)) - len(pairs),
                   force_loops=form.get("force_loops", "").strip(), threshold=form.get("threshold", "").strip())

    @classmethod
    def from_request(cls, request: dict, model: str = "main", snapshot: dict | None = None) -> EditorState:
        """The editor for a request, and for a trace's `snapshot` its forced loops and threshold too."""
        snapshot = snapshot or {}
        threshold = snapshot.get("threshold")
        return cls([list(p) for p in request["mapping"]], request["start"], str(request["steps"]), model=model,
                   force_loops=str(snapshot.get("force_loops") or ""),
                   threshold="" if threshold in (None, DEFAULT_THRESHOLD) else str(threshold))

    def as_request_value(self) -> dict:
        """The seed's request JSON; steps stays a string unless it is a plain whole number."""
        steps = self.steps.strip()
        return {"mapping": [list(p) for p in self.pairs], "start": self.start,
                "steps": int(steps) if re.fullmatch(r"[0-9]{1,4}", steps) else steps}

    def apply(self, action: str, rng: random.Random) -> None:
        """One editor action: `up:N`, `down:N`, `shuffle`, or `preset:NAME`."""
        verb, _, arg = action.partition(":")
        if verb in ("up", "down") and plain_digits(arg):
            i = int(arg)
            j = i - 1 if verb == "up" else i + 1
            if 0 <= i < len(self.pairs) and 0 <= j < len(self.pairs):
                self.pairs[i], self.pairs[j] = self.pairs[j], self.pairs[i]
        elif verb == "shuffle":
            self.pairs = shuffle_rules(self.pairs, rng)
        elif verb == "preset" and arg in PRESETS:
            self.pairs = preset(arg, rng)
        elif verb == "start" and arg in SYMBOLS:
            self.start = arg


def parse_request(state: EditorState, models=("main",)) -> DemoRequest:
    """Raises RequestError with the owner's message and the field it concerns; `models`: the names offered."""
    if state.extra_rules:  # the owner's message for a table that is not 26 rules
        raise RequestError("Supply all 26 A–Z rules, with one destination per node", "mapping")
    request = DemoRequest.parse(state.as_request_value())
    if state.model not in models:
        raise RequestError("Choose one of the models offered", "model")
    request = request.with_options(state.force_loops or None, state.threshold or None)
    return dataclasses.replace(request, model=state.model)
