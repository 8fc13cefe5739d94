"""A follower of a follow link in a test: its SSE stream read on a thread of its own, chunk by chunk."""

from __future__ import annotations

import threading


class Follower:
    def __init__(self, client, events_url: str) -> None:
        self.got: list[str] = []
        self._client, self._url = client, events_url
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        stream = self._client.get(self._url, buffered=False)
        for chunk in stream.response:
            self.got.append(chunk.decode())
        stream.close()

    @property
    def text(self) -> str:
        return "".join(self.got)
