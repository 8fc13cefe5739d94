"""What went wrong in a run, on hand-made traces: the verdict, the graph's edges and the summary's words."""

import re
from html import unescape

import pytest

from webapp.loops.request import DemoRequest
from webapp.loops.task import SYMBOLS
from webapp.loops.trace import SAFETY_CAP, TraceBuilder, score_trace
from webapp.loops.verdict import WrongHop, of_trace, verdict
from webapp.loops.web import pictures

CYCLE = [[s, SYMBOLS[(i + 1) % 26]] for i, s in enumerate(SYMBOLS)]  # A→B→C→…→Z→A


def snapshot(steps: int, predictions: str, stop_reason: str = "head") -> dict:
    request = DemoRequest.parse({"mapping": CYCLE, "start": "A", "steps": steps})
    builder = TraceBuilder(request)
    for loop, letter in enumerate(predictions, start=1):
        builder.add({"loop": loop, "prediction": letter, "direct_prediction": letter,
                     "stop_probability": 0.9 if loop == len(predictions) else 0.1,
                     "top3": [{"symbol": letter, "probability": 0.9}], "arrival_seconds": 0.001 * loop})
    rows = builder.rows
    return {"schema_version": 1, "source": "live", "checkpoint": "test:hand-made",
            "request": request.payload(), "threshold": 0.5, "safety_cap": SAFETY_CAP, "status": "complete",
            "trace": rows, "summary": score_trace(request, rows, stop_reason), "inference_seconds": 0.01}


def judged(steps: int, predictions: str, stop_reason: str = "head"):
    snap = snapshot(steps, predictions, stop_reason)
    return snap, of_trace(snap["request"], snap["trace"], stop_reason)


def edge_kinds(snap) -> dict[tuple[str, str], str]:
    """(source, destination) -> kind, read back from the graph's drawn edges by their coordinates."""
    found = of_trace(snap["request"], snap["trace"], snap["summary"]["stop_reason"])
    drawn = pictures.graph(snap["request"], snap["trace"], found)
    kinds = {}
    for src in SYMBOLS:
        for dst in SYMBOLS:
            if src != dst:
                shape = pictures._edge(src, dst, "")
                for edge in drawn["edges"]:
                    if not edge["loop"] and all(edge[c] == shape[c] for c in ("x1", "y1", "x2", "y2")):
                        kinds[(src, dst)] = edge["kind"]
    return kinds


def test_the_four_ways_to_stop_and_the_first_wrong_hop():
    mapping = dict(CYCLE)
    assert verdict("A", mapping, 3, list("BCD"), True).solved
    assert verdict("A", mapping, 3, list("BC"), True).stop == "early"
    assert verdict("A", mapping, 3, list("BCDE"), True).stop == "late"
    assert verdict("A", mapping, 3, list("BCDE"), False).stop == "never"
    wrong = verdict("A", mapping, 4, list("BXYZ"), True)
    assert wrong.stop == "exact" and not wrong.solved
    assert wrong.wrong_hop == WrongHop(loop=2, source="B", predicted="X", rule="C")
    assert wrong.wrong_hops == 1  # X→Y→Z follow the table, from the wrong letter


def test_a_wrong_hop_after_k_is_not_the_first_error_but_is_counted():
    found = verdict("A", dict(CYCLE), 2, list("BCQR"), True)
    assert found.wrong_hop is None and found.wrong_hops == 1 and found.stop == "late"


@pytest.mark.parametrize("steps, predictions, reason, words", [
    (3, "BCD", "head", "Every hop right, and it stopped at loop 3, as it should."),
    (5, "BCXYZAB", "head",
     "Wrong hop at loop 3: from C it predicted X, the rule says C → D; then it stopped at loop 7 instead of 5."),
    (4, "BXYZ", "head", "Wrong hop at loop 2: from B it predicted X, the rule says B → C; "
                        "it still stopped at loop 4, as it should."),
    (9, "BCDEFGQRSTUVW", "cap", "Wrong hop at loop 7: from G it predicted Q, the rule says G → H; "
                                "then it never stopped (ran to the 272-loop cap; it should have stopped at loop 9)."),
    (5, "BC", "head", "Every hop it took was right, but it stopped at loop 2 instead of 5, 3 loops early."),
    (3, "BCDEF", "head", "Every hop right, but it stopped at loop 5 instead of 3, 2 loops late."),
    (3, "BCDE", "head", "Every hop right, but it stopped at loop 4 instead of 3, 1 loop late."),
    (3, "BCDEFG", "cap", "Every hop right up to loop 3, but it never stopped (ran to the 272-loop cap)."),
    (2, "BCQR", "head", "Every hop right, but it stopped at loop 4 instead of 2, 2 loops late. "
                        "After loop 2 it also took 1 wrong hop."),
])
def test_the_summary_says_what_went_wrong(loop_app, steps, predictions, reason, words):
    from webapp.loops.web.render import render_results
    snap = snapshot(steps, predictions, reason)
    with loop_app.test_request_context("/loops/"):
        html = render_results(snap)
    said = re.search(r'<p class="verdict" id="verdict">(.*?)</p>', html, re.S).group(1)
    assert " ".join(unescape(said).split()) == words
    assert ("Solved" in html) == (words.startswith("Every hop right, and"))


def test_the_summary_lists_the_first_wrong_hop_and_how_far_off_the_stop_was(loop_app):
    from webapp.loops.web.render import render_results
    with loop_app.test_request_context("/loops/"):
        wrong = unescape(render_results(snapshot(5, "BCXYZAB")))
        early = unescape(render_results(snapshot(5, "BC")))
        right = unescape(render_results(snapshot(3, "BCDEF")))
    assert '<dt>First wrong hop</dt><dd class="no">loop 3: C → X (the rule: C → D)</dd>' in wrong
    assert "<dd>7 (2 past k)</dd>" in wrong
    assert "<dt>First wrong hop</dt><dd>none in the 2 loops it ran</dd>" in early
    assert "<dd>2 (3 short of k)</dd>" in early
    assert "<dt>First wrong hop</dt><dd>none up to loop 3</dd>" in right
    assert "First error" not in wrong + early + right


def test_right_hops_after_k_are_not_drawn_as_a_wrong_path():
    snap = snapshot(3, "BCDEF")
    kinds = edge_kinds(snap)
    assert [kinds[e] for e in [("A", "B"), ("B", "C"), ("C", "D")]] == ["true"] * 3
    assert kinds[("D", "E")] == kinds[("E", "F")] == "extra"
    assert not {"wrong", "astray"} & set(kinds.values())
    drawn = pictures.graph(snap["request"], snap["trace"], of_trace(snap["request"], snap["trace"], "head"))
    assert drawn["kinds"] == ["true", "extra"] and drawn["first_error"] is None
    node = {n["symbol"]: n["classes"].split() for n in drawn["nodes"]}
    assert "answer" in node["D"] and "stopped" in node["F"] and "error" not in node["F"]


def test_the_wrong_hop_is_red_and_the_path_after_it_dashed_red():
    snap = snapshot(5, "BCXYZAB")
    kinds = edge_kinds(snap)
    assert kinds[("C", "X")] == "wrong"
    assert kinds[("X", "Y")] == kinds[("Y", "Z")] == kinds[("Z", "A")] == "astray"
    assert kinds[("A", "B")] == kinds[("C", "D")] == kinds[("E", "F")] == "true"  # taken again later: still true
    drawn = pictures.graph(snap["request"], snap["trace"], of_trace(snap["request"], snap["trace"], "head"))
    assert drawn["kinds"] == ["true", "wrong", "astray"] and drawn["first_error"] == 3
    node = {n["symbol"]: n["classes"].split() for n in drawn["nodes"]}
    assert "error" in node["X"] and "stopped" in node["B"] and "answer" in node["F"]


def test_a_solved_run_marks_no_stopped_letter_and_draws_only_the_true_path():
    snap = snapshot(3, "BCD")
    drawn = pictures.graph(snap["request"], snap["trace"], of_trace(snap["request"], snap["trace"], "head"))
    assert drawn["kinds"] == ["true"]
    assert not any("stopped" in n["classes"] or "error" in n["classes"] for n in drawn["nodes"])


def test_the_graph_caption_names_only_what_is_drawn(loop_app):
    from webapp.loops.web.render import render_results
    with loop_app.test_request_context("/loops/"):
        late = " ".join(unescape(render_results(snapshot(3, "BCDEF"))).split())
        wrong = " ".join(unescape(render_results(snapshot(5, "BCXYZAB"))).split())
        never = " ".join(unescape(render_results(snapshot(3, "BCDEFG", "cap"))).split())
    assert "right hops after loop 3" in late and "wrong hops" not in late and "it stopped on F after loop 5" in late
    assert 'class="edge edge-extra"' in late and "edge-wrong" not in late and "edge-astray" not in late
    assert "wrong hops" in wrong and "its path after a wrong hop" in wrong
    assert "first wrong hop at loop 3, to X (ringed red)" in wrong and "right hops after" not in wrong
    assert "still on G at the 272-loop cap" in never
