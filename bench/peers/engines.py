"""A Glassbox front before a real llama.cpp server (llama-cpp-python's `python -m llama_cpp.server`), checked
as a user would meet it: the checks that tests/chat/decode/test_remote_servers.py makes against a fake server.

    .venv/bin/python -m bench.peers.engines              # setup (first run ~15-40 min), then every check
    .venv/bin/python -m bench.peers.engines --setup-only # build the environment and the GGUF files only
    .venv/bin/python -m bench.peers.engines --no-doc     # do not append the results to docs/scaling.md

Its environment is its own, under .bench/engines/ (gitignored): a venv with llama-cpp-python
(bench.peers.llamacpp's version and CMAKE_ARGS) built from its sdist with the `server` extras, and the GGUF files
made by `python -m webapp.chat.export gguf`: the bundled byte-level chat model (f32) and a small GPT-2-BPE
model with random weights (f32; its checkpoint written beside it so a Glassbox can load it too).

The checks, each on loopback ports with real gunicorn (gunicorn.conf.py) for every Glassbox:
1. greedy: the README's kind of questions to the bundled model, through the front (/v1, temperature 0)
   and to a Glassbox alone: the same text;
2. odds: the front's /v1 with logprobs: an entry with a logprob for every token of the reply;
3. Stop: a streamed reply closed after a few chunks: the front cancels, the backend sees its client go, and
   the next reply is whole;
4. a backend killed (-9) mid-reply: the reply ends in an error that names it, the front stays ready;
5. 8 users at once (one /v1 request each): with `--interrupt_requests False` all complete and equal to the
   reply alone; with llama-cpp-python's defaults each is complete or failed as cut short, none cut silently;
6. a front with a different tokenizer (GPT-2's BPE) before the byte-level backend: the chat page streams the
   reply with odds on every token and saves it complete, /v1 with logprobs answers 200, no traceback;
and the GPT-2-BPE model served the same way: greedy equal to Glassbox alone.
Never part of `make test`: nothing imports this module, and its first run needs PyPI.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from bench.peers.llamacpp_env import CMAKE_ARGS, LLAMA_CPP_PYTHON, _run, _step, sdist_tarball

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".bench" / "engines"  # gitignored
VENV = HOME / "venv"
VPY = VENV / "bin" / "python"
SDIST = HOME / "sdist"
MODELS = HOME / "models"
QUESTIONS = ["Hello!", "What is the capital of France?", "What is the chemical symbol for gold?",
             "What is 7 plus 5?", "What is Glassbox?"]
THREADS = 1


# -- the environment ------------------------------------------------------------------------------
def _has(module: str) -> bool:
    return subprocess.run([str(VPY), "-c", f"import {module}"], capture_output=True).returncode == 0


def setup() -> None:
    """.bench/engines/venv with llama-cpp-python[server] built from source; skipped when done."""
    HOME.mkdir(parents=True, exist_ok=True)
    if not VPY.exists():
        _step(f"creating {VENV}")
        _run([sys.executable, "-m", "venv", VENV])
    tarball = sdist_tarball(VPY, SDIST)
    if not _has("llama_cpp.server.app"):
        log = HOME / "build.log"
        _step(f"building llama-cpp-python[server] {LLAMA_CPP_PYTHON}, CMAKE_ARGS={CMAKE_ARGS!r} (log: {log})")
        env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
        _run([VPY, "-m", "pip", "install", "-v", f"{tarball}[server]", "numpy"], log=log, env=env)
    _step("ready")


def _glassbox_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("GLASSBOX_")}


def gpt2_checkpoint() -> Path:
    """A small GPT-2-BPE chat model with random weights, saved as Glassbox loads a checkpoint."""
    import torch
    from safetensors.torch import save_file

    from webapp.chat.model.gpt import GPT, GPTConfig
    directory = MODELS / "gpt2-small-random"
    path = directory / "model.safetensors"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        config = {"n_layer": 2, "n_head": 4, "n_embd": 128, "block_size": 512, "vocab_size": 50304}
        model = GPT(GPTConfig(**config))
        save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}, str(path))
        (directory / "config.json").write_text(json.dumps({**config, "tokenizer": "gpt2"}))
    return path


def export(checkpoint: Path | None, name: str) -> Path:
    out = MODELS / f"{name}.gguf"
    if not out.exists():
        env = _glassbox_env()
        if checkpoint is not None:
            env["GLASSBOX_CHAT_CHECKPOINT"] = str(checkpoint)
        _step(f"python -m webapp.chat.export gguf {out} --outtype f32")
        _run([sys.executable, "-m", "webapp.chat.export", "gguf", out, "--outtype", "f32"], env=env)
    return out


# -- servers -----------------------------------------------------------------------------------------
class LlamaServer:
    """`python -m llama_cpp.server` on a free port; `flags` beside the model, host and port."""

    def __init__(self, model: Path, flags: list[str], log: Path, n_ctx: int = 1024) -> None:
        from tests.support.servers import free_port, wait_until
        self.port = free_port()
        self.flags = ["--n_ctx", str(n_ctx), "--n_threads", str(THREADS), *flags]  # n_ctx: the model's window
        self.command = [str(VPY), "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1",
                        "--port", str(self.port), *self.flags]
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT)
        if not wait_until(lambda: self.proc.poll() is not None or _status(self.url + "/models") == 200, 120):
            raise SystemExit(f"llama_cpp.server did not start:\n{log.read_text()[-2000:]}")
        if self.proc.poll() is not None:
            raise SystemExit(f"llama_cpp.server exited:\n{log.read_text()[-2000:]}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except Exception:  # noqa: BLE001 - anything but 200 is "not yet"
        return None


def glassbox(work: Path, name: str, checkpoint: Path | None, backend: str | None = None):
    from tests.support.servers import Gunicorn
    # the 8 users are one address here: their limits per owner and per client raised above 8
    env = {"GLASSBOX_MAX_JOBS_PER_OWNER": "32", "GLASSBOX_MAX_STREAMS_PER_CLIENT": "32",
           "GLASSBOX_TORCH_THREADS": str(THREADS)}
    if checkpoint is not None:
        env["GLASSBOX_CHAT_CHECKPOINT"] = str(checkpoint)
    if backend:
        env["GLASSBOX_CHAT_BACKEND"] = f"openai:{backend}"
    for key in [k for k in os.environ if k.startswith("GLASSBOX_CHAT_")]:
        env.setdefault(key, "")
    return Gunicorn(work / name, env).start(ready_timeout=180)


def chat(base: str, question: str, max_tokens: int = 60, **extra) -> tuple[int, dict]:
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens, "temperature": 0,
            **extra}
    request = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def stream(base: str, question: str, max_tokens: int, *, close_after: int | None = None,
           on_chunk=None) -> tuple[list[str], str]:
    """A streamed /v1 reply -> (its data lines, how it ended)."""
    host, port = base.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    lines = []
    try:
        while True:
            raw = response.readline()
            if not raw:
                return lines, "eof"
            line = raw.decode().strip()
            if line.startswith("data:"):
                lines.append(line[5:].strip())
                if on_chunk is not None:
                    on_chunk(len(lines))
                if lines[-1] == "[DONE]":
                    return lines, "done"
                if close_after is not None and len(lines) >= close_after:
                    return lines, "closed"
    finally:
        conn.close()


# -- the checks ----------------------------------------------------------------------------------------
def run_checks(work: Path) -> tuple[list[tuple[str, str, str]], dict]:
    bundled = export(None, "bundled-f32")
    gpt2_ckpt = gpt2_checkpoint()
    gpt2 = export(gpt2_ckpt, "gpt2-small-random-f32")
    results: list[tuple[str, str, str]] = []
    flags: dict[str, list[str]] = {}

    def check(name: str, ok: bool, detail: str) -> None:
        results.append((name, "pass" if ok else "FAIL", detail))
        print(f"  {'pass' if ok else 'FAIL'}: {name}: {detail}", flush=True)

    alone = glassbox(work, "alone", None)
    safe = ["--interrupt_requests", "False"]
    llama = LlamaServer(bundled, safe, work / "llama-safe.log")
    flags["safe"] = llama.flags
    front = glassbox(work, "front", None, llama.url)
    try:
        # 1. greedy equal to Glassbox alone
        same, differ = 0, []
        for q in QUESTIONS:
            a, b = chat(alone.url, q), chat(front.url, q)
            ta, tb = a[1]["choices"][0]["message"]["content"], b[1]["choices"][0]["message"]["content"]
            if ta == tb:
                same += 1
            else:
                differ.append(f"{q!r}: alone {ta!r}, front {tb!r}")
        check("greedy reply equal to Glassbox alone (bundled model)", same == len(QUESTIONS),
              f"{same}/{len(QUESTIONS)} equal" + (f"; {'; '.join(differ)}" if differ else ""))
        # 2. odds on every token
        status, reply = chat(front.url, QUESTIONS[1], logprobs=True, top_logprobs=5)
        content = (reply.get("choices") or [{}])[0].get("logprobs", {}).get("content") or []
        with_odds = sum(1 for e in content if e.get("logprob") is not None)
        tokens = reply.get("usage", {}).get("completion_tokens")
        check("odds on every token", status == 200 and with_odds == len(content) == tokens and tokens > 0,
              f"HTTP {status}, {with_odds} of {len(content)} entries with a logprob, {tokens} tokens")
        # 3. Stop
        lines, how = stream(front.url, "Tell me about Glassbox.", 200, close_after=3)
        time.sleep(2)
        gone = "Disconnected" in llama.log.read_text() or "disconnected" in llama.log.read_text()
        status, after = chat(front.url, QUESTIONS[0])
        check("Stop (the stream closed after 3 chunks)", how == "closed" and status == 200,
              f"closed after {len(lines)} chunks; backend saw its client go: {gone}; next reply HTTP {status}")
        # 5. 8 users at once, --interrupt_requests False
        check_concurrent(check, front.url, "--interrupt_requests False", expect_all=True)
    finally:
        front.stop()
        llama.stop()
    # 5b. llama-cpp-python's default flags: replies interrupted, never silently
    llama = LlamaServer(bundled, [], work / "llama-default.log")
    flags["default"] = llama.flags
    front = glassbox(work, "front-default", None, llama.url)
    try:
        check_concurrent(check, front.url, "llama-cpp-python's defaults (--interrupt_requests True)", expect_all=False)
        # 4. killed mid-reply
        seen = threading.Event()
        box: dict = {}

        def read():
            box["lines"], box["how"] = stream(front.url, "Tell me about Glassbox.", 300,
                                              on_chunk=lambda n: n >= 3 and seen.set())
        reader = threading.Thread(target=read)
        reader.start()
        seen.wait(60)
        llama.kill()
        reader.join(120)
        text = " ".join(box.get("lines", []))
        check("backend killed (-9) mid-reply", "stopped mid-reply" in text and _status(front.url + "/readyz") == 200,
              f"stream ended ({box.get('how')}) with the error naming the backend: {'stopped mid-reply' in text}; "
              f"front still ready: {_status(front.url + '/readyz') == 200}")
    finally:
        front.stop()
        llama.stop()
    # 6. a front with GPT-2's BPE before the byte-level backend
    llama = LlamaServer(bundled, safe, work / "llama-other.log")
    other = glassbox(work, "front-gpt2", gpt2_ckpt, llama.url)
    try:
        check_other_tokenizer(check, other)
    finally:
        other.stop()
        llama.stop()
    # the GPT-2-BPE model itself through llama.cpp
    llama = LlamaServer(gpt2, safe, work / "llama-gpt2.log", n_ctx=512)
    alone2 = glassbox(work, "alone-gpt2", gpt2_ckpt)
    front2 = glassbox(work, "front-gpt2-same", gpt2_ckpt, llama.url)
    try:
        pairs = [(chat(alone2.url, q, 30)[1], chat(front2.url, q, 30)[1]) for q in QUESTIONS[:3]]
        equal = sum(1 for a, b in pairs if a["choices"][0]["message"]["content"] ==
                    b["choices"][0]["message"]["content"])
        check("greedy reply equal to Glassbox alone (GPT-2-BPE model, random weights)", equal == len(pairs),
              f"{equal}/{len(pairs)} equal")
    finally:
        front2.stop()
        alone2.stop()
        llama.stop()
        alone.stop()
    return results, flags


def check_concurrent(check, base: str, label: str, *, expect_all: bool) -> None:
    question = "What is the capital of France?"
    alone = chat(base, question)[1]["choices"][0]["message"]["content"]
    out: list = [None] * 8

    def ask(i):
        out[i] = chat(base, question)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(600)
    complete = sum(1 for s, r in out if s == 200 and r["choices"][0]["message"]["content"] == alone)
    honest = sum(1 for s, r in out if s != 200 and "cut short" in json.dumps(r))
    others = [f"HTTP {s}: {json.dumps(r)[:200]}" for s, r in out
              if not (s == 200 and r["choices"][0]["message"]["content"] == alone)
              and not (s != 200 and "cut short" in json.dumps(r))]
    silent = len(others)
    ok = silent == 0 and (complete == 8 if expect_all else True)
    check(f"8 users at once, {label}", ok,
          f"{complete} complete and equal to the reply alone, {honest} failed as cut short, {silent} otherwise"
          + (f" ({'; '.join(others)})" if others else ""))


def check_other_tokenizer(check, front) -> None:
    from tests.integration.helpers import message_id, saved_message, start_reply
    from tests.support.servers import Client
    client = Client(front.url)
    url = start_reply(client, tokens=60, content="What is the capital of France?")
    events = list(client.open_stream(url, timeout=300).events())
    names = [e.name for e in events]
    saved = saved_message(front.instance, message_id(url))
    with sqlite3.connect(front.instance / "glassbox.sqlite3") as db:
        row = db.execute("SELECT odds FROM reply_details WHERE message_id = ?", (message_id(url),)).fetchone()
    odds = json.loads(row[0]) if row and row[0] else []
    no_odds = sum(1 for row in odds if row[1] is None)
    status, reply = chat(front.url, "What is the capital of France?", logprobs=True, top_logprobs=5)
    traceback = "Traceback" in front.log()
    check("a front with another tokenizer (GPT-2 BPE before the byte-level backend)",
          names[-1:] == ["done"] and saved["status"] == "complete" and no_odds == 0 and status == 200
          and not traceback,
          f"chat page: {names.count('token')} token events, ends with {names[-1:]}, saved {saved['status']!r}, "
          f"{len(odds)} odds rows ({no_odds} without a probability); /v1 with logprobs HTTP {status}; "
          f"traceback in the log: {traceback}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.engines")
    parser.add_argument("--setup-only", action="store_true")
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args(argv)
    setup()
    if args.setup_only:
        export(None, "bundled-f32")
        export(gpt2_checkpoint(), "gpt2-small-random-f32")
        return 0
    import tempfile

    from bench import common
    with tempfile.TemporaryDirectory(prefix="engines-") as tmp:
        results, flags = run_checks(Path(tmp))
    version = subprocess.run([str(VPY), "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    body = (f"llama-cpp-python {version} (`python -m llama_cpp.server`, built with CMAKE_ARGS={CMAKE_ARGS}), "
            f"flags beside --model/--host/--port: `{' '.join(flags.get('safe', []))}` (and llama-cpp-python's "
            f"defaults where said: `{' '.join(flags.get('default', []))}`).\n\n"
            + common.table(["check", "result", "detail"], [list(r) for r in results]))
    print(body)
    if not args.no_doc:
        doc = ROOT / "docs" / "scaling.md"
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        with open(doc, "a") as out:
            out.write(f"\n### bench.peers.engines {stamp}\n\n`{common.command_line()}` at {common.revision()}, "
                      f"{common.machine()}.\n\n{body}\n")
    return 0 if all(r[1] == "pass" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
