"""Glassbox in front of a real llama.cpp server (issue 52, item 4): llama.cpp's own `llama-server`, on its default
flags, serving the bundled chat model (exported with `python -m webapp.chat.export gguf`); Glassbox's gunicorn with
GLASSBOX_CHAT_BACKEND pointing at it; N users sending a message at the same moment. Per reply: whether it
completed (and how many tokens), or the error the page showed; the queue positions Glassbox told each user; the
slots llama-server says it has (`GET /props`), which Glassbox reads at start-up and never exceeds.

    .venv/bin/python -m bench.peers.llamacpp_server --server PATH/TO/llama-server     # 8 users
    .venv/bin/python -m bench.peers.llamacpp_server --build       # first builds llama-server (minutes, 2 cores)

--build compiles llama-server from the llama.cpp that llama-cpp-python's sdist vendors (bench/peers/llamacpp_env.py
downloads it) into .bench/llamacpp/server-build, with -march=native. Nothing here is part of `make test`: the test
suite checks the same behaviour against a fake that speaks llama-server's wire (tests/integration/test_remote.py).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench import common
from bench.peers.llamacpp_env import HOME, LLAMA_CPP_PYTHON, sdist_tarball
from tests.support.servers import Client, Gunicorn, free_port, stream_url, wait_until

BUILD = HOME / "server-build"
SERVER = BUILD / "build" / "bin" / "llama-server"


def build() -> Path:
    """llama-server built from the sdist's vendored llama.cpp (skipped when built already)."""
    if SERVER.exists():
        return SERVER
    tarball = sdist_tarball(Path(sys.executable), HOME / "sdist")
    source = BUILD / "llama.cpp"
    if not source.exists():
        vendor = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
        with tarfile.open(tarball) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(vendor)]
            for m in members:
                m.name = m.name[len(vendor):]
            tar.extractall(source, members=[m for m in members if m.name], filter="data")
    subprocess.run(["cmake", "-S", source, "-B", BUILD / "build", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"], check=True)
    subprocess.run(["cmake", "--build", BUILD / "build", "--target", "llama-server", "-j2"], check=True)
    return SERVER


def get_json(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def one_user(server: Gunicorn, question: str, tokens: int, results: list, start: threading.Event) -> None:
    client = Client(server.url)
    client.get("/chat/")
    start.wait()
    began = time.monotonic()
    sent = client.post("/chat/send", {"content": question, "max_new_tokens": str(tokens)}, htmx=True)
    events = list(client.open_stream(stream_url(sent.text), timeout=300).events())
    positions = [int(m) for e in events if e.name == "position" for m in re.findall(r"position (\d+)", e.data)]
    final = events[-1].data if events else ""
    error = re.search(r'class="badge error"[^>]*>(.*?)<', final, re.S)
    status = re.search(r'class="message assistant (\w+)', final)
    results.append({"complete": "assistant complete" in final, "status": status.group(1) if status else final[:300],
                    "tokens": sum(e.name == "token" for e in events),
                    "error": error.group(1).strip() if error else None,
                    "most_ahead": max(positions, default=0), "seconds": time.monotonic() - began})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", type=Path, default=None, help="llama-server (default: the one --build made)")
    parser.add_argument("--build", action="store_true", help="build llama-server first, from llama-cpp-python's sdist")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--no-doc", action="store_true", help="print only; leave docs/benchmarks-history.md")
    args = parser.parse_args()
    binary = build() if args.build else (args.server or SERVER)
    if not binary.exists():
        raise SystemExit(f"no llama-server at {binary}: give --server PATH, or --build")
    load_before = common.load_average()
    with tempfile.TemporaryDirectory() as work:
        gguf = Path(work) / "bundled-f32.gguf"
        subprocess.run([sys.executable, "-m", "webapp.chat.export", "gguf", str(gguf)], check=True, cwd=common.ROOT)
        port = free_port()
        llama = subprocess.Popen([str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert wait_until(lambda: (get_json(f"http://127.0.0.1:{port}/health") or {}).get("status") == "ok", 120)
            slots = (get_json(f"http://127.0.0.1:{port}/props") or {}).get("total_slots")
            # every user here comes from one loopback address, which may watch 6 streams at once by default
            env = {"GLASSBOX_CHAT_BACKEND": f"openai:http://127.0.0.1:{port}/v1",
                   "GLASSBOX_MAX_STREAMS_PER_CLIENT": "0"}
            server = Gunicorn(Path(work) / "instance", env).start()
            try:
                results: list[dict] = []
                start = threading.Event()
                users = [threading.Thread(target=one_user, args=(server, f"What is {i} + {i}?", args.tokens,
                                                                 results, start)) for i in range(args.users)]
                for user in users:
                    user.start()
                start.set()
                for user in users:
                    user.join(600)
            finally:
                server.stop()
        finally:
            llama.terminate()
            llama.wait(30)
    completed = [r for r in results if r["complete"]]
    errors = sorted({r["error"] or r["status"] for r in results if not r["complete"]})
    body = common.table(
        ["users at once", "llama-server slots (/props)", "completed", "failed", "errors shown", "tokens a reply",
         "highest queue position told", "slowest reply (s)"],
        [[args.users, slots, len(completed), len(results) - len(completed), "; ".join(errors) or "none",
          f"{min((r['tokens'] for r in completed), default=0)}–{max((r['tokens'] for r in completed), default=0)}",
          max((r["most_ahead"] for r in results), default=0), max((r["seconds"] for r in results), default=0)]])
    common.report("A real llama.cpp server behind Glassbox, many users at once", body, load_before=load_before,
                  write_doc=not args.no_doc)
    if len(completed) != args.users:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
