"""What the Inside page shows of its report: tokens that are only whitespace are named, as in the token panel."""

from __future__ import annotations

import torch

from webapp.chat.inside.jobs import InsideReport, InsideRequest, LensRow
from webapp.chat.inside.view import attended, lens_view
from webapp.chat.model.tokenizer import ByteTokenizer


def report() -> InsideReport:
    context = (ord("A"), ord(" "), ord("\n"), ord("B"))  # positions 0..3
    attention = torch.tensor([[[0.1, 0.5, 0.3, 0.1]]])  # one block, one head: the space, then the newline
    lens = [LensRow(0, ((ord(" "), 0.6), (ord("\n"), 0.3), (ord("x"), 0.1)), 0.3, 2)]
    return InsideReport(InsideRequest(context, ord("\n"), 0), lens, attention, [[[1.0]]], [[(1, 0.5)]])


def test_whitespace_tokens_are_named_in_the_lens_and_the_attended_positions():
    tokenizer = ByteTokenizer()
    cells = lens_view(tokenizer, report())[0].top
    assert [(c.text, c.name) for c in cells] == [(" ", "space"), ("\n", "newline"), ("x", "x")]
    heads = attended(tokenizer, report(), layer=0, head=0, prompt_length=2)
    assert [(a.position, a.name, a.part) for a in heads[:2]] == [(1, "space", "prompt"), (2, "newline", "reply")]
