"""A Loop-lab sweep, pure: its request and exact-message checks, its seeded tables, and scoring.

A sweep runs `tables` seeded tables of one family at each k, on one model or two (the same tables for
both). Each run is scored by the seed's own summary (webapp/loops/trace.py score_trace); a k's line
counts those summaries, so it equals what scripts/eval_loops.py computes on the same runs: answer
correct, complete trajectory, exact stop, joint success, as fractions of the k's runs.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from webapp.digits import plain_digits
from webapp.loops.request import MAX_STEPS, DemoRequest, RequestError
from webapp.loops.task import SYMBOLS, preset

FAMILIES = ("function", "permutation", "cycle", "cycle_tail", "identity")
MEASURES = ("answer_correct", "complete_trajectory", "exact_stop", "joint_success")
KEYS = {"model", "family", "k", "tables", "seed", "runs"}
REQUIRED = {"family", "k", "tables", "seed"}
MAX_SEED = 2**32 - 1
MAX_MODELS = 2

WRONG_KEYS = "Supply family, k, tables and seed (model and runs are optional), and nothing else"
WRONG_FAMILY = "Family must be one of " + ", ".join(FAMILIES)
WRONG_K = (f"k must be a list of integers from 1 to {MAX_STEPS}, or a range "
           f'{{"from": a, "to": b, "step": s}} within 1 to {MAX_STEPS}')
WRONG_SEED = f"Seed must be an integer from 0 to {MAX_SEED}"
WRONG_RUNS = "runs must be true or false"


@dataclass(frozen=True)
class SweepSpec:
    models: tuple[str, ...]
    family: str
    ks: tuple[int, ...]
    tables: int
    seed: int
    runs: bool = False

    @classmethod
    def parse(cls, value: Any, *, models: Sequence[str], max_tables: int, max_runs: int) -> SweepSpec:
        """`models`: the names offered, the default first. Raises RequestError with the exact message."""
        if not isinstance(value, dict) or not REQUIRED <= set(value) <= KEYS:
            raise RequestError(WRONG_KEYS, "request")
        chosen = _models(value.get("model", models[0]), models)
        if value["family"] not in FAMILIES:
            raise RequestError(WRONG_FAMILY, "family")
        ks = _ks(value["k"])
        tables = value["tables"]
        if not _int(tables) or not 1 <= tables <= max_tables:
            raise RequestError(f"Tables must be an integer from 1 to {max_tables}", "tables")
        seed = value["seed"]
        if not _int(seed) or not 0 <= seed <= MAX_SEED:
            raise RequestError(WRONG_SEED, "seed")
        runs = value.get("runs", False)
        if not isinstance(runs, bool):
            raise RequestError(WRONG_RUNS, "runs")
        total = len(ks) * tables * len(chosen)
        if total > max_runs:
            raise RequestError(f"A sweep may make at most {max_runs} runs (k values × tables × models); "
                               f"this one asks for {total}", "tables")
        return cls(chosen, value["family"], ks, tables, seed, runs)

    def payload(self) -> dict:
        return {"model": list(self.models), "family": self.family, "k": list(self.ks), "tables": self.tables,
                "seed": self.seed}

    @property
    def total(self) -> int:
        return len(self.ks) * self.tables * len(self.models)


def _int(value: Any) -> bool:
    return type(value) is int  # bool is not an int here, nor is 1.0


def _models(value: Any, offered: Sequence[str]) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if (not isinstance(names, list) or not 1 <= len(names) <= MAX_MODELS or len(set(map(str, names))) != len(names)
            or not all(isinstance(n, str) and n in offered for n in names)):
        raise RequestError("model must be one of the models offered, or a list of two of them: "
                           + ", ".join(offered), "model")
    return tuple(names)


def _ks(value: Any) -> tuple[int, ...]:
    if isinstance(value, dict):
        if not {"from", "to"} <= set(value) <= {"from", "to", "step"}:
            raise RequestError(WRONG_K, "k")
        low, high, step = value["from"], value["to"], value.get("step", 1)
        if not all(_int(v) for v in (low, high, step)) or not 1 <= low <= high <= MAX_STEPS or step < 1:
            raise RequestError(WRONG_K, "k")
        return tuple(range(low, high + 1, step))
    if (not isinstance(value, list) or not value
            or not all(_int(k) and 1 <= k <= MAX_STEPS for k in value)):
        raise RequestError(WRONG_K, "k")
    return tuple(sorted(set(value)))


def parse_k_text(text: str) -> Any:
    """The page's k field as the JSON value: "1,2,4,8" -> [1, 2, 4, 8]; "1-64" or "1-256:8" -> a range;
    anything else is left as text, for SweepSpec.parse to refuse with its message."""
    text = text.strip().replace(" ", "")
    low, dash, rest = text.partition("-")
    if dash:
        high, colon, step = rest.partition(":")
        if plain_digits(low) and plain_digits(high) and (not colon or plain_digits(step)):
            return {"from": int(low), "to": int(high), **({"step": int(step)} if colon else {})}
        return text
    parts = text.split(",")
    return [int(p) for p in parts] if all(plain_digits(p) for p in parts) else text


def table(family: str, seed: int, k: int, index: int) -> DemoRequest:
    """The index-th table at k: seeded by (family, seed, k, index) alone, so adding a k to a sweep
    leaves the other k's tables as they were, and two models get the same tables."""
    rng = random.Random(f"glassbox-sweep:{family}:{seed}:{k}:{index}")
    pairs = preset(family, rng)
    return DemoRequest.parse({"mapping": pairs, "start": rng.choice(SYMBOLS), "steps": k})


def plan(spec: SweepSpec) -> list[tuple[int, int, DemoRequest]]:
    """(k, index, request) for every table, k by k."""
    return [(k, i, table(spec.family, spec.seed, k, i)) for k in spec.ks for i in range(spec.tables)]


def stop_offset(summary: dict, k: int) -> str:
    """Where the run stopped against k: "-2" two loops early, "0" exact, "3" late; "never": the cap."""
    return "never" if summary["stop_reason"] != "head" else str(summary["executed_loops"] - k)


def k_line(k: int, summaries: Iterable[dict]) -> dict:
    """One k's line from its runs' summaries (score_trace's)."""
    summaries = list(summaries)
    n = len(summaries)
    line: dict[str, Any] = {"k": k, "n": n}
    for measure in MEASURES:
        line[measure] = sum(bool(s[measure]) for s in summaries) / n if n else 0.0
    offsets = Counter(stop_offset(s, k) for s in summaries)
    line["stop_offsets"] = dict(sorted(offsets.items(), key=lambda kv: _offset_order(kv[0])))
    errors = Counter(s["first_error"] for s in summaries if s["first_error"] is not None)
    line["first_errors"] = {str(loop): count for loop, count in sorted(errors.items())}
    return line


def _offset_order(key: str) -> float:
    return math.inf if key == "never" else int(key)


def totals(lines: Iterable[dict]) -> dict:
    """The summary of a model's k lines: runs, and each measure over all of them."""
    lines = list(lines)
    n = sum(line["n"] for line in lines)
    out: dict[str, Any] = {"n": n}
    for measure in MEASURES:
        hits = sum(round(line[measure] * line["n"]) for line in lines)
        out[measure] = hits / n if n else 0.0
    return out


def wilson(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion (sound at 0 and n, unlike the normal one)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def stop_kind(offset: str) -> str:
    """early / exact / late / never, for the stop histogram's colours."""
    if offset == "never":
        return "never"
    value = int(offset)
    return "exact" if value == 0 else "early" if value < 0 else "late"


def disagreements(spec: SweepSpec, summaries: dict[str, list[dict | None]]) -> list[int]:
    """Indices into plan(spec) of the tables on which two models' runs scored differently."""
    if len(spec.models) < 2:
        return []
    a, b = (summaries[m] for m in spec.models)
    return [i for i, (x, y) in enumerate(zip(a, b))
            if x is not None and y is not None and any(x[m] != y[m] for m in MEASURES)]
