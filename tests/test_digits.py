"""plain_digits: the check before int() of a typed count (webapp/digits.py)."""

from __future__ import annotations

import pytest

from webapp.chat.heads.view import BadHead, parse_head
from webapp.digits import plain_digits


@pytest.mark.parametrize("text", ["0", "7", "123456789012345678"])
def test_ascii_digits_are_counts(text):
    assert plain_digits(text) and int(text) >= 0


@pytest.mark.parametrize("text", ["", "²", "①", "٣", "1²", "-1", "+1", " 1", "1 ", "1.0", "9" * 19, "9" * 4301])
def test_what_isdigit_or_int_reads_otherwise_is_not(text):
    assert not plain_digits(text)


@pytest.mark.parametrize("value", ["1.²", "①.0", "٣.1", "1." + "9" * 4301])
def test_a_head_named_with_other_digits_is_refused_with_its_message(value):
    with pytest.raises(BadHead, match="layer.head"):
        parse_head(value)
