"""SSE framing: multi-line fragments, leading spaces, every kind of line break."""

from tests.conftest import sse_events as parse
from webapp.web.sse import comment, frame


def test_multiline_fragment_round_trips():
    html = '<div class="row">\n  <span>x</span>\n</div>'
    assert parse(frame("row", html)) == [("row", html)]


def test_leading_spaces_survive():
    assert parse(frame("token", " world")) == [("token", " world")]
    assert parse(frame("token", "  ")) == [("token", "  ")]


def test_carriage_returns_are_line_breaks_not_frame_breakers():
    # \r alone would end a line for the browser; it must become a data line of its own
    text = "a\rb\r\nc\n\nd"
    assert parse(frame("token", text)) == [("token", "a\nb\nc\n\nd")]


def test_text_that_looks_like_fields_stays_data():
    text = "x\nevent: done\ndata: evil"
    assert parse(frame("token", text)) == [("token", text)]


def test_unicode_line_separators_are_not_split():
    text = "a\u2028b\x0bc\x1cd"
    assert parse(frame("token", text)) == [("token", text)]


def test_comment_is_ignored_and_cannot_inject():
    assert parse(comment("hi\nevent: x\ndata: y") + frame("a", "b")) == [("a", "b")]
