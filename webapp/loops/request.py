"""A Loop-lab request: an ordered A–Z table, a start letter and a step count.

The checks run in the owner's order, each with the owner's exact message, so scripts written
against the owner's demo get the same answers here.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from webapp.loops.task import SYMBOLS, execute

MAX_STEPS = 256
DEFAULT_THRESHOLD = 0.5  # the completion head stops a run once its stop probability reaches this
FORCE_CAP = 999  # loops a forced run may take: the loop counter has three digits


class RequestError(ValueError):
    """Bad input.  `field` says which form field it concerns (for showing it inline)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


@dataclass(frozen=True)
class DemoRequest:
    """The ORDER of the rules is part of the model's prompt; destinations may repeat."""

    pairs: tuple[tuple[str, str], ...]
    start: str
    steps: int
    model: str = "main"  # which of the Loop lab's models runs it (webapp/loops/service.py); not in payload()
    # How it runs (not in payload(): the body stays the owner's request): the head's stop threshold, and
    # force_loops, N loops whatever the head says (None: until the head stops it or the safety cap).
    threshold: float = DEFAULT_THRESHOLD
    force_loops: int | None = None
    keep_states: bool = False  # the run keeps each loop's state for its caller (a sweep's probe)

    @classmethod
    def parse(cls, value: Any, *, max_steps: int = MAX_STEPS) -> DemoRequest:
        if not isinstance(value, dict) or set(value) != {"mapping", "start", "steps"}:
            raise RequestError("Supply exactly mapping, start, and steps", "request")
        rules = value["mapping"]
        if not isinstance(rules, list) or len(rules) != 26:
            raise RequestError("Supply all 26 A–Z rules, with one destination per node", "mapping")
        if not all(_is_rule(rule) for rule in rules):
            raise RequestError("Each rule must be a pair of uppercase A–Z letters", "mapping")
        if {rule[0] for rule in rules} != set(SYMBOLS):
            raise RequestError("Each A–Z source must occur exactly once", "mapping")
        if not _is_letter(value["start"]):
            raise RequestError("Start must be an uppercase A–Z letter", "start")
        steps = value["steps"]
        if type(steps) is not int or not 1 <= steps <= max_steps:  # bool is not an int here
            raise RequestError(f"Steps must be an integer from 1 to {max_steps}", "steps")
        return cls(tuple((src, dst) for src, dst in rules), value["start"], steps)

    @property
    def mapping(self) -> dict[str, str]:
        return dict(self.pairs)

    def trajectory(self) -> list[str]:
        """[x1 … xk]: the reference answer, computed only by the consumer, never shown to the model."""
        return execute(self.mapping, self.start, self.steps)

    def with_options(self, force_loops: str | None, threshold: str | None) -> DemoRequest:
        """This request, run as ?force_loops= and ?threshold= (query strings, None: not given) say;
        raises RequestError."""
        if force_loops is not None:
            if not re.fullmatch(r"[0-9]{1,4}", force_loops) or not 1 <= int(force_loops) <= FORCE_CAP:
                raise RequestError(f"force_loops must be an integer from 1 to {FORCE_CAP}", "force_loops")
        value = DEFAULT_THRESHOLD
        if threshold is not None:
            try:
                value = float(threshold)
            except ValueError:
                value = math.nan
            if not 0 < value < 1:  # NaN fails too
                raise RequestError("threshold must be a number greater than 0 and less than 1", "threshold")
        return dataclasses.replace(self, threshold=value,
                                   force_loops=None if force_loops is None else int(force_loops))

    def payload(self) -> dict:
        return {"mapping": [list(p) for p in self.pairs], "start": self.start, "steps": self.steps}


def _is_letter(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 1 and value in SYMBOLS


def _is_rule(rule: Any) -> bool:
    return isinstance(rule, list) and len(rule) == 2 and all(_is_letter(s) for s in rule)
