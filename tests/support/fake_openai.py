"""A fake OpenAI-compatible chat server in the test process, speaking the wire of each real server a
Glassbox front meets (webapp/chat/decode/remote/): `style` is

- "openai": OpenAI's and Glassbox's own /v1: every token's `bytes`, the text in `delta.content`;
- "llamacpp": llama-cpp-python's server (0.3.x, `python -m llama_cpp.server`): a first chunk with the role
  only; each token's text decoded alone with the broken bytes of a split character dropped (so "" for part
  of one) and `bytes: null`; the chosen token added after its top_logprobs; its sampling defaults (top_k 40,
  top_p 0.95, min_p 0.05, repeat_penalty 1.1); with `interrupt`, a running stream ends with `[DONE]` and no
  finish_reason when another request arrives (its default `interrupt_requests=True`);
- "vllm": vLLM's: each token's text decoded alone (U+FFFD for part of a character) and its `bytes` those of
  that text, the reply's text decoded incrementally (a character comes whole, with the token that ends it);
  the model's generation_config.json as its defaults (top_k 50 from Glassbox's export) and
  repetition_penalty 1.0; it validates the sampling fields as vLLM does.

The reply's token count: "openai" and "vllm" send `usage` in a last chunk with no choices when the request
asks (`stream_options.include_usage`); llama-cpp-python's server never does. `usage_tokens` makes that count
differ from the tokens streamed (a real server counts tokens the front cannot see: a stop string's, a
template's); `timings` adds llama.cpp's server's `timings` (`predicted_n`) to the last chunk with a choice.

`slots` makes it llama.cpp's llama-server as far as GET /props goes (its `total_slots`); `most` is the
most requests it answered at once.

The reply is `text`, cut into tokens: one per character (`split="chars"`, a GPT-2-like vocabulary) or
one per byte (`split="bytes"`, the bundled byte-level model). Each token has probability 0.5, and "x" (0.3)
is the first alternative (llama.cpp: ten alternatives without the token, then the token). The fake
samples as a real server would only in this: when the request's sampling (over the style's defaults) is
not plain temperature/top-k, the reply is PENALIZED_TEXT, as a repeat penalty changes a real greedy reply.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PENALIZED_TEXT = "penalized"
NEUTRAL = {"top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0, "repetition_penalty": 1.0,
           "presence_penalty": 0.0, "frequency_penalty": 0.0}
DEFAULTS = {
    "openai": {},
    "llamacpp": {"top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.1},
    "vllm": {"top_k": 50},  # Glassbox's generation_config.json (webapp/chat/model/hf.py), read by vLLM
}


class Fake(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, text="Hi there", die_after=None, delay=0.0, status=200, *, style="openai", split="chars",
                 finish="stop", interrupt=False, top_k_wanted=None, usage_tokens=None, timings=None, slots=None,
                 n_ctx=None):
        super().__init__(("127.0.0.1", 0), Handler)
        self.text, self.die_after, self.delay, self.status = text, die_after, delay, status
        self.style, self.split, self.finish, self.interrupt = style, split, finish, interrupt
        self.top_k_wanted = top_k_wanted  # the top_k a plain reply needs (None: the request's own is fine)
        self.usage_tokens, self.timings = usage_tokens, timings  # the count reported (None: the tokens sent)
        self.bodies, self.hangups, self.models_checked = [], 0, 0
        self.streaming = 0  # requests being answered now
        self.most = 0  # the most answered at once
        self.slots = slots  # llama.cpp's llama-server: its `total_slots` in GET /props (None: no /props)
        self.n_ctx = n_ctx  # and its slots' context, `default_generation_settings.n_ctx` (None: not said)
        self.arrivals = 0
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def tokens(self) -> list[bytes]:
        if self.split == "bytes":
            return [bytes([b]) for b in self.text.encode()]
        return [ch.encode() for ch in self.text]

    def plain(self, body: dict) -> bool:
        """Would this request sample as Glassbox does (temperature and top-k only)?"""
        effective = {**DEFAULTS[self.style], **body}
        if any(effective.get(k, v) != v for k, v in NEUTRAL.items() if k in effective):
            return False
        return self.top_k_wanted is None or effective.get("top_k") == self.top_k_wanted


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Fake

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/props":  # llama-server's, beside /v1
            if self.server.slots is None:
                self._json(404, {"error": {"message": "File Not Found"}})
            else:
                said = {"n_ctx": self.server.n_ctx} if self.server.n_ctx is not None else {}
                self._json(200, {"total_slots": self.server.slots, "model_alias": "fake",
                                 "default_generation_settings": said})
            return
        self.server.models_checked += 1
        if self.server.style == "llamacpp":  # llama-cpp-python's list
            self._json(200, {"object": "list", "data": [{"id": "fake.gguf", "object": "model", "owned_by": "me",
                                                          "permissions": []}]})
            return
        self._json(200, {"data": [{"id": "fake"}]})

    def _json(self, status: int, data: dict) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send(self, data) -> None:
        self.wfile.write(f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode())
        self.wfile.flush()

    def _refusal(self, body: dict) -> str | None:
        if self.server.style == "vllm":  # vLLM's checks (vllm/sampling_params.py)
            if not 0 < body.get("top_p", 1.0) <= 1 or not 0 <= body.get("min_p", 0.0) <= 1:
                return "top_p must be in (0, 1] and min_p in [0, 1]"
            if body.get("top_k", 0) < -1 or body.get("repetition_penalty", 1.0) <= 0:
                return "top_k must be 0, -1 or at least 1; repetition_penalty must be > 0"
        if self.server.style == "llamacpp" and body.get("top_k", 0) < 0:  # pydantic: ge=0
            return "top_k: Input should be greater than or equal to 0"
        return None

    def do_POST(self):
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.bodies.append(body)
        refusal = self._refusal(body)
        if server.status != 200 or refusal:
            self._json(server.status if server.status != 200 else 400,
                       {"error": {"message": refusal or "no such model"}})
            return
        with server.lock:
            server.arrivals += 1
            server.streaming += 1
            server.most = max(server.most, server.streaming)
            me = server.arrivals
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            self._stream(body, me)
        except OSError:
            server.hangups += 1
        finally:
            with server.lock:
                server.streaming -= 1

    def _stream(self, body: dict, me: int) -> None:
        server = self.server
        tokens = server.tokens() if server.plain(body) else [ch.encode() for ch in PENALIZED_TEXT]
        if server.style == "llamacpp":
            self._send({"choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                     "finish_reason": None}]})
        held = b""  # vLLM's incremental detokenizer: bytes of a character not yet whole
        for i, data in enumerate(tokens):
            if server.die_after is not None and i == server.die_after:
                self.connection.close()  # the backend dies: no finish, no [DONE]
                return
            if server.interrupt and server.arrivals > me:  # llama-cpp-python: a newer request came
                self._send("[DONE]")
                return
            if server.style == "llamacpp":
                token = data.decode("utf-8", errors="ignore")
                text, raw = token, None
            elif server.style == "vllm":
                token = data.decode("utf-8", errors="replace")
                raw = list(token.encode())
                held += data
                try:
                    text, held = held.decode("utf-8"), b""
                except UnicodeDecodeError:
                    text = ""
            else:
                token, raw = data.decode("utf-8", errors="replace"), list(data)
                text = token
            def alt(t, p, b):
                return {"token": t, "logprob": math.log(p), "bytes": b}
            top = [alt("x", 0.3, None if raw is None else [120]), alt(token, 0.5, raw)]
            if server.style == "llamacpp":  # a dict: its top 10 (here without the chosen), then the chosen added
                top = [alt("x", 0.3, None)] + [alt(f"y{j}", 0.01, None) for j in range(9)] + [alt(token, 0.5, None)]
            entry = {"token": token, "logprob": math.log(0.5), "bytes": raw, "top_logprobs": top}
            chunk = {"choices": [{"index": 0, "delta": {"content": text},
                                  "logprobs": {"content": [entry]} if body.get("logprobs") else None,
                                  "finish_reason": None}]}
            self._send(chunk)
            time.sleep(server.delay)
        count = len(tokens) if server.usage_tokens is None else server.usage_tokens
        last = {"choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": server.finish}]}
        if server.timings:  # llama.cpp's server: its own figures with the last chunk
            last["timings"] = {"predicted_n": server.timings, "predicted_ms": 12.5}
        self._send(last)
        if server.style != "llamacpp" and (body.get("stream_options") or {}).get("include_usage"):
            self._send({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": count,
                                                  "total_tokens": 7 + count}})
        self._send("[DONE]")
