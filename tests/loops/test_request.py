"""Every validation message of the Loop-lab request, in the owner's order."""

import pytest

from webapp.loops.request import DemoRequest, RequestError
from webapp.loops.task import SYMBOLS


def valid(**changes):
    value = {"mapping": [[s, SYMBOLS[(i + 1) % 26]] for i, s in enumerate(SYMBOLS)], "start": "A", "steps": 5}
    value.update(changes)
    return value


def message(value):
    with pytest.raises(RequestError) as caught:
        DemoRequest.parse(value)
    return caught.value.message


def test_valid_request_parses_and_keeps_rule_order():
    value = valid()
    value["mapping"].reverse()
    request = DemoRequest.parse(value)
    assert request.pairs[0] == ("Z", "A") and request.steps == 5
    assert request.trajectory() == ["B", "C", "D", "E", "F"]
    assert request.payload() == value


@pytest.mark.parametrize("value", [[], "x", None, {"mapping": [], "start": "A"},
                                   {**valid(), "extra": 1}])
def test_not_exactly_the_three_keys(value):
    assert message(value) == "Supply exactly mapping, start, and steps"


@pytest.mark.parametrize("mapping", ["AB", None, [["A", "B"]] * 25, [["A", "B"]] * 27])
def test_not_26_rules(mapping):
    assert message(valid(mapping=mapping)) == "Supply all 26 A–Z rules, with one destination per node"


@pytest.mark.parametrize("bad", [["a", "B"], ["A", "b"], ["A"], ["A", "B", "C"], ("A", "B"), ["AB", "C"],
                                 ["A", 1], "AB", ["Ä", "B"]])
def test_bad_rule(bad):
    value = valid()
    value["mapping"][3] = bad
    assert message(value) == "Each rule must be a pair of uppercase A–Z letters"


def test_duplicate_source():
    value = valid()
    value["mapping"][1] = ["A", "C"]
    assert message(value) == "Each A–Z source must occur exactly once"


@pytest.mark.parametrize("start", ["a", "AB", "", 1, None, "1"])
def test_bad_start(start):
    assert message(valid(start=start)) == "Start must be an uppercase A–Z letter"


@pytest.mark.parametrize("steps", [True, False, 0, 257, -1, 1.0, "5", None])
def test_bad_steps(steps):
    assert message(valid(steps=steps)) == "Steps must be an integer from 1 to 256"


def test_checks_run_in_order():
    # bad rules and bad steps at once: the rule message comes first
    value = valid(steps=0)
    value["mapping"][0] = ["a", "b"]
    assert message(value) == "Each rule must be a pair of uppercase A–Z letters"


def test_destinations_may_repeat():
    request = DemoRequest.parse(valid(mapping=[[s, "A"] for s in SYMBOLS]))
    assert request.trajectory() == ["A"] * 5
