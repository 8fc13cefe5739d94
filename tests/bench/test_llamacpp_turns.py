"""bench.peers.llamacpp's turns: every stream prefills once, then takes its share of the decode steps in turns of
--slice, the order reversed each turn, and each one's tokens and seconds add up as one uninterrupted run's."""

from __future__ import annotations

import pytest

from bench.peers.llamacpp_streams import decode_interleaved, slices
from bench.rooflines import TurnReads


def test_slices_add_up_to_the_steps():
    assert slices(100, 20) == [20] * 5
    assert slices(45, 20) == [20, 20, 5]
    assert slices(7, 0) == [7] and slices(7, 50) == [7]


class Fake:
    """A stream that counts: token i is `base + i`, each step takes `pace` seconds; `log` records the turns."""

    def __init__(self, name: str, base: int, pace: float, log: list):
        self.name, self.base, self.pace, self.log, self.next = name, base, pace, log, 0

    def start(self, ids, logits=False):
        self.log.append((self.name, "start"))
        self.next = 1
        return {"prefill_s": 0.5, "decode_s": 0.0, "tokens": [self.base], "logits": [1.0] if logits else None}

    def more(self, new):
        self.log.append((self.name, new))
        tokens = list(range(self.base + self.next, self.base + self.next + new))
        self.next += new
        return {"prefill_s": 0.0, "decode_s": new * self.pace, "tokens": tokens, "logits": None}


def test_turns_alternate_and_add_up():
    log: list = []
    streams = {"a": Fake("a", 100, 0.01, log), "b": Fake("b", 200, 0.02, log)}
    results = decode_interleaved(streams, ["a", "b"], [1, 2, 3], 45, 20, {"a"})
    assert log == [("a", "start"), ("b", "start"), ("a", 20), ("b", 20), ("b", 20), ("a", 20), ("a", 5), ("b", 5)]
    for name, base, pace in (("a", 100, 0.01), ("b", 200, 0.02)):
        assert results[name]["tokens"] == list(range(base, base + 46))  # the prompt's token and 45 steps, in order
        assert results[name]["decode_s"] == pytest.approx(45 * pace)
        assert results[name]["prefill_s"] == 0.5
    assert results["a"]["logits"] == [1.0] and results["b"]["logits"] is None


def test_the_bandwidth_is_read_after_every_turn():
    log: list = []
    streams = {"a": Fake("a", 100, 0.01, log), "b": Fake("b", 200, 0.02, log)}
    decode_interleaved(streams, ["a", "b"], [1], 45, 20, set(), between_turns=lambda: log.append("read"))
    assert log == [("a", "start"), ("b", "start"), ("a", 20), ("b", 20), "read", ("b", 20), ("a", 20), "read",
                   ("a", 5), ("b", 5), "read"]


def test_turn_reads_keep_every_reading():
    reads = TurnReads(mib=4, reps=2)
    first, second = reads(), reads()
    assert reads.readings == [first, second]
    assert all(0 < r < 10_000 for r in reads.readings)  # GB/s: a read that took no time would be infinite
