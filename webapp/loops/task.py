"""Pointer chasing over an A–Z table: the task the Loop-lab model solves.

A table maps each of the 26 letters to one letter (a function, so destinations
may repeat). From x0 = start the model must produce x1..xk, xt = table[x(t-1)],
and stop after exactly k hops. Dependency-free: the web layer and the training
script both import it.

Prompt format, version PROMPT_FORMAT ("v1"):

    "AQ BZ CD ... ZY;s=K;k=007;"

26 rules as source+destination pairs in the order given (the order is part of
the prompt), separated by single spaces; then ";s=" and the start letter;
then ";k=" and the number of hops as three digits; then a closing ";".
Lowercase "s"/"k" keep the markers apart from the A–Z letters. Every v1 prompt
is exactly PROMPT_LENGTH characters long.
"""

import random

SYMBOLS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
PROMPT_FORMAT = "v1"
PROMPT_LENGTH = 26 * 3 - 1 + len(";s=K") + len(";k=000;")  # 88
MAX_STEPS = 999  # three digits of k
PRESETS = ("cycle", "identity", "permutation", "function", "cycle_tail")


def execute(mapping: dict[str, str], start: str, steps: int) -> list[str]:
    """Return [x1..xk] for x0 = start, xt = mapping[x(t-1)]."""
    trajectory, current = [], start
    for _ in range(steps):
        current = mapping[current]
        trajectory.append(current)
    return trajectory


def render_prompt(pairs, start: str, steps: int) -> str:
    """Render an ordered table, start letter and hop count as a v1 prompt."""
    rules = [tuple(pair) for pair in pairs]
    if len(rules) != 26 or any(len(r) != 2 or r[0] not in SYMBOLS or r[1] not in SYMBOLS
                               or len(r[0]) != 1 or len(r[1]) != 1 for r in rules):
        raise ValueError("A prompt needs 26 rules, each a pair of uppercase A–Z letters")
    if sorted(src for src, _ in rules) != list(SYMBOLS):
        raise ValueError("Each A–Z source must occur exactly once")
    if not isinstance(start, str) or len(start) != 1 or start not in SYMBOLS:
        raise ValueError("Start must be an uppercase A–Z letter")
    if type(steps) is not int or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"Steps must be an integer from 1 to {MAX_STEPS}")
    table = " ".join(src + dst for src, dst in rules)
    return f"{table};s={start};k={steps:03d};"


def shuffle_rules(pairs, rng: random.Random) -> list[list[str]]:
    """Same table, rules in a random order (a different prompt, same answer)."""
    shuffled = [list(pair) for pair in pairs]
    rng.shuffle(shuffled)
    return shuffled


def _pairs(destinations: dict[str, str]) -> list[list[str]]:
    return [[src, destinations[src]] for src in SYMBOLS]


def preset(name: str, rng: random.Random) -> list[list[str]]:
    """A table by name, rules in A..Z order; `rng` draws the random parts.

    cycle: one 26-cycle through all letters in a random order.
    identity: every letter maps to itself.
    permutation: a random permutation (a union of cycles).
    function: a random function; destinations may repeat.
    cycle_tail: a short cycle (3–8 letters) and the other letters in one
        tail that runs into it, so a walk from the tail's end takes ~20 hops
        before it starts repeating.
    """
    letters = list(SYMBOLS)
    if name == "identity":
        return _pairs({s: s for s in SYMBOLS})
    if name == "function":
        return _pairs({s: rng.choice(SYMBOLS) for s in SYMBOLS})
    rng.shuffle(letters)
    if name == "permutation":
        return _pairs(dict(zip(SYMBOLS, letters)))
    if name == "cycle":
        return _pairs({a: b for a, b in zip(letters, letters[1:] + letters[:1])})
    if name == "cycle_tail":
        size = rng.randint(3, 8)
        ring, tail = letters[:size], letters[size:]
        table = {a: b for a, b in zip(ring, ring[1:] + ring[:1])}
        table.update({a: b for a, b in zip(tail, tail[1:])})
        table[tail[-1]] = rng.choice(ring)
        return _pairs(table)
    raise ValueError(f"Unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
