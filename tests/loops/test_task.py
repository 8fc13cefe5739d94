import random

import pytest

from webapp.loops.task import PRESETS, PROMPT_LENGTH, SYMBOLS, execute, preset, render_prompt, shuffle_rules


def cycle_length_from(table, start):
    seen, x, t = {}, start, 0
    while x not in seen:
        seen[x] = t
        x, t = table[x], t + 1
    return t - seen[x]


def test_execute_returns_x1_to_xk():
    table = {s: s for s in SYMBOLS} | {"A": "B", "B": "C", "C": "A"}
    assert execute(table, "A", 5) == ["B", "C", "A", "B", "C"]
    assert execute(table, "Z", 2) == ["Z", "Z"]


def test_execute_follows_a_function_with_repeated_destinations():
    table = {s: "Q" for s in SYMBOLS} | {"Q": "A"}
    assert execute(table, "M", 4) == ["Q", "A", "Q", "A"]


def test_render_prompt_format():
    pairs = preset("identity", random.Random(0))
    prompt = render_prompt(pairs, "K", 7)
    assert prompt.startswith("AA BB CC ")
    assert prompt.endswith("YY ZZ;s=K;k=007;")
    assert len(prompt) == PROMPT_LENGTH == 88
    assert render_prompt(pairs, "K", 256).endswith(";k=256;")


def test_rule_order_is_part_of_the_prompt():
    pairs = preset("function", random.Random(1))
    shuffled = shuffle_rules(pairs, random.Random(2))
    assert sorted(shuffled) == sorted(pairs)
    assert render_prompt(shuffled, "A", 3) != render_prompt(pairs, "A", 3)
    assert render_prompt(tuple(tuple(p) for p in pairs), "A", 3) == render_prompt(pairs, "A", 3)


@pytest.mark.parametrize("pairs, start, steps", [
    ([["A", "B"]] * 26, "A", 1),
    ([[s, s] for s in SYMBOLS], "a", 1),
    ([[s, s] for s in SYMBOLS], "A", 0),
    ([[s, s] for s in SYMBOLS], "A", 1000),
    ([[s, s.lower()] for s in SYMBOLS], "A", 1),
])
def test_render_prompt_rejects_bad_input(pairs, start, steps):
    with pytest.raises(ValueError):
        render_prompt(pairs, start, steps)


@pytest.mark.parametrize("name", PRESETS)
def test_presets_are_full_tables_in_a_to_z_order(name):
    pairs = preset(name, random.Random(3))
    assert [src for src, _ in pairs] == list(SYMBOLS)
    assert all(dst in SYMBOLS and len(dst) == 1 for _, dst in pairs)


def test_preset_shapes():
    rng = random.Random(4)
    assert all(src == dst for src, dst in preset("identity", rng))
    assert sorted(dst for _, dst in preset("permutation", rng)) == list(SYMBOLS)
    cycle = dict(preset("cycle", rng))
    assert cycle_length_from(cycle, "A") == 26
    for seed in range(20):
        tail = dict(preset("cycle_tail", random.Random(seed)))
        lengths = {cycle_length_from(tail, s) for s in SYMBOLS}
        assert len(lengths) == 1 and 3 <= lengths.pop() <= 8   # one short cycle everything runs into


def test_presets_are_reproducible_and_unknown_names_fail():
    assert preset("function", random.Random(5)) == preset("function", random.Random(5))
    with pytest.raises(ValueError, match="Unknown preset"):
        preset("spiral", random.Random(0))
