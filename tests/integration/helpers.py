"""Small steps the integration tests share: start a reply or a run, read what was saved."""

from __future__ import annotations

import html
import re
import sqlite3
import threading

from tests.support.servers import Client, stream_url, wait_until


def start_reply(client: Client, prefix: str = "", tokens: int = 250, content: str = "Tell me a story") -> str:
    """Send a chat message as htmx does; returns the reply's stream URL."""
    client.get(f"{prefix}/chat/")
    reply = client.post(f"{prefix}/chat/send", {"content": content, "max_new_tokens": str(tokens)}, htmx=True)
    assert reply.status == 200, reply.text
    return stream_url(reply.text)


def start_run(client: Client, prefix: str = "", steps: int = 8) -> str:
    """Run the Loop lab on its default table; returns the run's stream URL."""
    lab = client.get(f"{prefix}/loops/")
    sources = re.findall(r'name="src" value="([A-Z])"', lab.text)
    data = {"src": sources, "dst": sources[1:] + sources[:1], "start": "A", "steps": str(steps)}
    live = client.post(f"{prefix}/loops/run", data, htmx=True)
    assert live.status == 200, live.text
    return stream_url(live.text)


def message_id(url: str) -> int:
    return int(re.search(r"/m/(\d+)/stream", url).group(1))


def saved_message(instance, message_id: int) -> dict:
    with sqlite3.connect(instance / "glassbox.sqlite3") as db:
        db.row_factory = sqlite3.Row
        return dict(db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone())


TOKEN_SPAN = re.compile(r'<span class="tok s\d" title="[\d.]+%">|</span>')  # each token's own wrapper


def streamed_text(events) -> str:
    """The reply text as the browser assembles it from token fragments (SSE turns \\r into \\n)."""
    return "".join(html.unescape(TOKEN_SPAN.sub("", e.data)) for e in events if e.name == "token")


def as_sse_text(text: str) -> str:
    return re.sub(r"\r\n|\r", "\n", text)


def wait_saved(content, shown: str, timeout: float = 60) -> None:
    """Until the stored reply (content(): its text now) holds all the reader was shown: the runner saves a
    reply every second or so, later on a loaded machine (a test that slept a second and a half lost that race)."""
    assert wait_until(lambda: as_sse_text(content()).startswith(shown), timeout), f"never saved: {shown!r}"


def read_until(client, url: str, tokens: int, timeout: float = 120):
    """Read a reply's stream on a thread -> (events so far, an Event set once `tokens` token events came,
    the thread): for tests that act on a reply part way through (Stop, kill -9)."""
    events, seen = [], threading.Event()

    def read():
        for event in client.open_stream(url, timeout=timeout).events():
            events.append(event)
            if sum(e.name == "token" for e in events) >= tokens:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return events, seen, reader
