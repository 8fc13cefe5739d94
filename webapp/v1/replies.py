"""A reply for the API: submit it to the shared core, follow its token events, stop at a stop
sequence, and answer as one JSON object or as a stream of `data:` chunks ending in `data: [DONE]`.

Both hold one GLASSBOX_MAX_STREAMS slot (webapp/web/streams.py), taken before the job is queued, since
both hold a gunicorn thread until the reply is done. Leaving the job's subscription cancels it: a
closed stream is noticed when a chunk or a heartbeat cannot be written, and a client that hangs up on a
non-streamed request is noticed by peeking at its socket while we wait.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import closing

from flask import Response, current_app, jsonify, request

from webapp.chat.decode.publish import TokenEvent
from webapp.chat.decode.types import ChatJob, ChatRequest
from webapp.chat.web.blueprint import service as chat_service
from webapp.core import Refused
from webapp.core.jobs import DONE, FAILED
from webapp.v1 import shapes
from webapp.v1.errors import ApiError
from webapp.v1.params import Ask
from webapp.web.api_auth import api_owner
from webapp.web.sse import comment
from webapp.web.streams import StreamSlot, held_slot, long_response

CLIENT_GONE_STATUS = 499  # nginx's code for "the client closed the request"; nobody reads this answer


class StopText:
    """The generated text, released only once no stop sequence can begin in it.

    Text that could be the start of a stop sequence is held back until the next token settles it, as
    llama.cpp's server does, so a stream never sends what it must then take back. Each token is kept
    with the offset where its text starts, and released with the text it begins."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.longest = max(map(len, stops), default=0)
        self.text = ""
        self.sent = 0  # characters released
        self.tokens: list[tuple[int, int, object]] = []  # (offset, token id, odds), not yet released
        self.stopped = False

    def add(self, text: str, token: tuple[int, object] | None = None) -> None:
        if self.stopped:
            return
        if token is not None:
            self.tokens.append((len(self.text), *token))
        searched = max(0, len(self.text) - self.longest + 1)  # a stop sequence may straddle the last piece
        self.text += text
        found = [i for i in (self.text.find(s, searched) for s in self.stops) if i >= 0]
        if found:
            self.text, self.stopped = self.text[:min(found)], True

    def _held(self) -> int:
        """How many trailing characters might begin a stop sequence."""
        for n in range(min(self.longest - 1, len(self.text) - self.sent), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def take(self, final: bool = False) -> tuple[str, list]:
        """The text and tokens now safe to send. At the end (`final`, or a stop sequence found) all the
        text that is kept, and the tokens that begin in it (all of them if no stop sequence was found)."""
        end = len(self.text) if final or self.stopped else len(self.text) - self._held()
        text, self.sent = self.text[self.sent:end], max(self.sent, end)
        if final and not self.stopped:
            ready, self.tokens = self.tokens, []
        else:
            ready = [t for t in self.tokens if t[0] < end]
            self.tokens = [t for t in self.tokens if t[0] >= end]
        return text, ready


class Follow:
    """One reply's events, as the API sends them, and how it ended."""

    def __init__(self, job: ChatJob, ask: Ask, heartbeat: float) -> None:
        self.job, self.ask, self.heartbeat = job, ask, heartbeat
        self.scan = StopText(ask.stops)
        self.generated = 0  # tokens generated, up to a stop sequence: the usage's completion_tokens

    def updates(self) -> Generator[None | int | tuple[str, list], None, None]:
        """None for a heartbeat, an int for the queue position, (text, tokens) to send. Tokens that make no
        text yet (a split character, a special) send nothing, so a heartbeat is due after a while of them as
        after a while of no event: a write is how a client that left is noticed."""
        said = time.monotonic()
        with closing(self.job.subscribe(self.heartbeat)) as events:
            for event in events:
                if event is not None and time.monotonic() - said >= self.heartbeat:
                    said = time.monotonic()
                    yield None
                if event is None:
                    said = time.monotonic()
                    yield None
                elif event.name == "position" and isinstance(event.data, dict):
                    yield event.data["position"]
                elif event.name == "token" and isinstance(event.data, TokenEvent):
                    data = event.data
                    token = None if data.token is None else (data.token, data.odds)  # None: no token of its own
                    self.generated += token is not None
                    self.scan.add(data.text, token)
                    if self.scan.stopped:
                        break  # leaving the subscription cancels the job: nobody else follows it
                    text, tokens = self.scan.take()
                    if text or tokens:
                        said = time.monotonic()
                        yield text, tokens
        text, tokens = self.scan.take(final=True)
        if text or tokens:
            yield text, tokens

    def error(self) -> ApiError | None:
        if self.scan.stopped or self.job.state == DONE:
            return None
        if self.job.state == FAILED:
            return ApiError(500, f"The model failed while generating: {self.job.error}", code="generation_failed")
        return ApiError(503, "The reply was stopped: the server is shutting down. Try again in a moment.",
                        code="closing")

    def finish_reason(self) -> str:
        if self.scan.stopped:
            return "stop"
        said = getattr(self.job.result, "stop_reason", None)  # the decoder's (or the remote server's) own
        if said in ("end", "length"):
            return "stop" if said == "end" else "length"
        # A reply ends by a special token only while it is shorter than max_new_tokens (Sequence.accept),
        # so a reply of exactly that length was cut by the limit.
        return "length" if self.generated >= self.ask.params.max_new_tokens else "stop"

    def logprobs(self, tokens: list) -> dict | None:
        tokenizer = chat_service().models.get(self.ask.model).tokenizer
        return shapes.logprobs_of(self.ask.kind, tokens, self.ask.logprobs, tokenizer)

    def usage(self) -> dict:
        # a remote backend's whole reply: its own count (a byte-level front splits its tokens into more pieces);
        # cut by a stop sequence here, the tokens sent
        said = getattr(self.job.result, "backend_tokens", None)
        counted = said if said is not None and not self.scan.stopped and self.job.state == DONE else self.generated
        return shapes.usage(len(self.ask.prompt_ids), counted)


def respond(ask: Ask) -> Response:
    """Queue the reply (refusals as OpenAI errors, nothing left queued) and answer it."""
    chat = chat_service()
    try:
        # before the job: a refusal leaves nothing queued. A whole (non-streamed) reply takes the bulk share
        with held_slot(bulk=not ask.stream) as slot:
            wanted = ChatRequest(ask.prompt_ids, ask.params, odds=ask.logprobs is not None, features=False,
                                 edit=ask.edit)  # nothing of an API reply is kept to show its features
            job = chat.submit_reply(api_owner(), wanted, model=ask.model)
    except Refused as error:
        raise ApiError.refused(error) from None
    meta = shapes.Meta.new("chatcmpl" if ask.kind == "chat" else "cmpl", job.id, ask.model, chat.models.get(ask.model))
    follow = Follow(job, ask, current_app.config["GLASSBOX"].heartbeat_seconds)
    if ask.stream:
        return long_response(_stream(follow, meta), "text/event-stream", slot)
    assert slot is not None  # held_slot() takes one unless told not to
    return _whole(follow, meta, slot, client_gone(request.environ))


def data(obj: dict | str) -> str:
    """One SSE event as OpenAI frames it: a single `data:` line and no event name (the openai package
    reads a named event differently). json.dumps writes no line breaks, so one line is always enough."""
    return "data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n"


def _stream(follow: Follow, meta: shapes.Meta) -> Iterator[str]:
    kind = follow.ask.kind
    # the first chunk goes out at once: gunicorn sends the headers with it
    yield data(shapes.chunk(kind, meta, role=True)) if kind == "chat" else comment("open")
    for update in follow.updates():
        if update is None:
            yield comment("keep-alive")  # also how a vanished client is noticed
        elif isinstance(update, int):
            yield comment(f"waiting: position {update}")
        else:
            text, tokens = update
            yield data(shapes.chunk(kind, meta, text=text, logprobs=follow.logprobs(tokens)))
    error = follow.error()
    if error is not None:
        yield data(error.body())  # the openai package raises APIError on a chunk with "error"
    else:
        yield data(shapes.chunk(kind, meta, finish=follow.finish_reason()))
        if follow.ask.include_usage:
            yield data(shapes.usage_chunk(kind, meta, follow.usage()))
    yield data("[DONE]")


def _whole(follow: Follow, meta: shapes.Meta, slot: StreamSlot, gone: Callable[[], bool]) -> Response:
    texts, tokens = [], []
    with slot, closing(follow.updates()) as updates:
        checked = time.monotonic()
        for update in updates:
            if isinstance(update, tuple):
                texts.append(update[0])
                tokens += update[1]
            if time.monotonic() - checked >= follow.heartbeat:
                checked = time.monotonic()
                if gone():  # closing the updates leaves the subscription: the job is cancelled
                    return Response(status=CLIENT_GONE_STATUS)
    error = follow.error()
    if error is not None:
        raise error
    return jsonify(shapes.completion(follow.ask.kind, meta, "".join(texts), follow.logprobs(tokens),
                                     follow.finish_reason(), follow.usage()))


def client_gone(environ) -> Callable[[], bool]:
    """Whether the client has closed its connection, for a request that writes nothing while it waits.
    gunicorn hands the socket over in the environ; the body was read already, so a readable socket
    with nothing to read means the client hung up."""
    sock = environ.get("gunicorn.socket")
    if sock is None:  # another server: never known to be gone
        return lambda: False

    def gone() -> bool:
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, ValueError):  # nothing after all; a TLS socket cannot peek
            return False
        except OSError:  # reset by the peer
            return True
    return gone
