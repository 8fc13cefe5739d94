"""The words templates share: counts with their nouns, and probabilities a room can compare (issue 51: the token
panel listed alternatives as "0.0%")."""

from __future__ import annotations

import pytest

from webapp.web.wording import count_of, log_probability, percent


@pytest.mark.parametrize("p, shown", [(0.123, "12.3%"), (1.0, "100.0%"), (0.0005, "0.1%"), (0.0004, "< 0.1%"),
                                      (1e-9, "< 0.1%"), (0.0, "0.0%")])
def test_a_probability_too_small_for_one_decimal_is_less_than_a_tenth_never_zero(p, shown):
    assert percent(p) == shown


def test_log_probabilities_tell_small_odds_apart():
    assert log_probability(1e-5) == "-11.51" and log_probability(1e-7) == "-16.12" and log_probability(0) == "−∞"
    assert percent(1e-5) == percent(1e-7)  # what the percentage alone cannot


def test_counts_agree_with_their_nouns():
    assert (count_of(1, "token"), count_of(0, "token"), count_of(1024, "entry", "entries")) == (
        "1 token", "0 tokens", "1,024 entries")
