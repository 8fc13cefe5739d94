"""What went wrong in one run, in the two ways a run can fail: a wrong hop, and stopping at the wrong loop.

Dependency-free (the web page and scripts/eval_loops.py both use it). The two are independent: a run
can take a wrong hop and still stop at loop k, or take every hop right and stop early, late or never.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

StopKind = Literal["exact", "early", "late", "never"]
STOP_KINDS: tuple[StopKind, ...] = ("exact", "early", "late", "never")


@dataclass(frozen=True)
class WrongHop:
    """The first loop ≤ k whose prediction breaks the table: from `source` the rule says `rule`."""
    loop: int
    source: str
    predicted: str
    rule: str


@dataclass(frozen=True)
class Verdict:
    steps: int                     # k
    loops: int                     # loops run
    stop: StopKind                 # exact: the head stopped it at loop k; never: it ran to the cap
    wrong_hop: WrongHop | None     # None: every hop up to min(k, loops) follows the table
    wrong_hops: int                # every loop, past k too, whose prediction breaks the table

    @property
    def solved(self) -> bool:
        return self.stop == "exact" and self.wrong_hop is None

    @property
    def loops_off(self) -> int:
        """How many loops too late (> 0) or too early (< 0) it stopped."""
        return self.loops - self.steps


def hops(start: str, mapping: dict[str, str], predictions: Sequence[str]) -> list[bool]:
    """Per loop: whether the prediction is the table's destination of the previous prediction."""
    previous, valid = start, []
    for letter in predictions:
        valid.append(mapping[previous] == letter)
        previous = letter
    return valid


def verdict(start: str, mapping: dict[str, str], steps: int, predictions: Sequence[str],
            stopped_by_head: bool) -> Verdict:
    """predictions: the model's letter at loops 1, 2, … up to where it stopped (or the cap)."""
    loops = len(predictions)
    if not stopped_by_head:
        stop: StopKind = "never"
    else:
        stop = "exact" if loops == steps else "early" if loops < steps else "late"
    valid = hops(start, mapping, predictions)
    # The first wrong hop within k is also the first wrong letter: up to it every letter was right.
    first = next((i for i, ok in enumerate(valid[:steps]) if not ok), None)
    wrong = None
    if first is not None:
        source = start if first == 0 else predictions[first - 1]
        wrong = WrongHop(loop=first + 1, source=source, predicted=predictions[first], rule=mapping[source])
    return Verdict(steps=steps, loops=loops, stop=stop, wrong_hop=wrong, wrong_hops=valid.count(False))


def of_trace(request: dict, rows: Sequence[dict], stop_reason: str, head_stop: int | None = None) -> Verdict:
    """The verdict on a trace snapshot's request payload, loop rows and summary's stop_reason. A forced
    run (stop_reason "forced") is judged up to where its head would have stopped it (`head_stop`, the
    summary's), or over all its loops as one never stopped."""
    mapping = {src: dst for src, dst in request["mapping"]}
    predictions = [row["prediction"] for row in rows]
    if stop_reason == "forced":
        return verdict(request["start"], mapping, request["steps"],
                       predictions[:head_stop] if head_stop else predictions, head_stop is not None)
    return verdict(request["start"], mapping, request["steps"], predictions, stop_reason == "head")
