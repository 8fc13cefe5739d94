"""SSE framing: multi-line fragments, leading spaces, every kind of line break."""

import threading
import time

from tests.conftest import sse_events as parse
from webapp.core.jobs import DONE, Job
from webapp.web.sse import comment, frame, stream_job


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


def stream_body(app, job, chunks: list[str]) -> str:
    """The body stream_job sends for `job`, each write the server makes appended to `chunks`."""
    with app.test_request_context():
        response = stream_job(job, lambda e: f"<b>{e.data['i']}</b>" if e.name == "token" else None,
                              lambda j: "end")
        try:
            for chunk in response.response:
                chunks.append(chunk.decode() if isinstance(chunk, bytes) else chunk)
        finally:
            response.close()
    return "".join(chunks)


def test_events_that_came_together_go_out_in_one_write_each_once_and_in_order(chat_app):
    """A stream that opens on a log of 200 tokens (a replay, or a stream slower than the steps) writes them
    at once, not one write each: every token still its own event, exactly once, in order."""
    job = Job("chat", "o")
    for i in range(200):
        job.keep("token", i=i)
    job.set_state(DONE)
    chunks: list[str] = []
    events = parse(stream_body(chat_app, job, chunks))
    assert [data for name, data in events if name == "token"] == [f"<b>{i}</b>" for i in range(200)]
    assert events[-1] == ("done", "end")
    assert len(chunks) <= 4  # the opening comment, the tokens, the end


def test_tokens_published_while_the_stream_follows_arrive_each_once_and_in_order(chat_app):
    job = Job("chat", "o")

    def publish():
        for i in range(300):
            job.keep("token", i=i)
            if i % 7 == 0:
                time.sleep(0.001)
        job.set_state(DONE)

    worker = threading.Thread(target=publish)
    worker.start()
    events = parse(stream_body(chat_app, job, []))
    worker.join()
    assert [data for name, data in events if name == "token"] == [f"<b>{i}</b>" for i in range(300)]
    assert events[-1] == ("done", "end")
