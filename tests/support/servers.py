"""Real servers for integration, browser and load tests: gunicorn with gunicorn.conf.py, nginx with a
config generated from deploy/nginx.conf, both on free loopback ports, and a small HTTP client that
keeps a session, sends the CSRF token as htmx does and reads SSE streams with arrival times."""

from __future__ import annotations

import http.client
import http.cookiejar
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
CHROMIUM = "/usr/bin/chromium"
LOOPBACK = "127.0.0.1"


def upstream_socket(port: int) -> Path:
    """The Unix socket a test gunicorn on `port` also listens on, and its nginx proxies to (as deployed)."""
    return Path(tempfile.gettempdir()) / f"glassbox-test-{port}.sock"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return None


def model_env(workdir: Path, *, chat_arch: str = "tiny:0.05", loop_delay: float = 0.0) -> dict:
    """GLASSBOX_* variables that load the small test models of tests/support/served_models.py."""
    from tests.support.chat_models import tiny_checkpoint
    checkpoint = workdir / "chat" / "model.safetensors"
    if not checkpoint.exists():
        tiny_checkpoint(checkpoint.parent)
    return {"GLASSBOX_CHAT_CHECKPOINT": str(checkpoint),
            "GLASSBOX_CHAT_FACTORY": "tests.support.served_models:build_chat_model",
            "GLASSBOX_CHAT_ARCH": chat_arch,
            "GLASSBOX_LOOP_MODEL": "tests.support.served_models:loop_bundle",
            "GLASSBOX_TEST_LOOP_DELAY": str(loop_delay)}


@dataclass
class Gunicorn:
    """`gunicorn -c gunicorn.conf.py wsgi:app`, as `make run` starts it, on a free port."""

    instance: Path
    env: dict
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    root: Path = ROOT  # the checkout it runs (a benchmark may start an older revision's worktree)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, ready_timeout: float = 60.0) -> Gunicorn:
        self.instance.mkdir(parents=True, exist_ok=True)
        self.log_path = self.instance / f"gunicorn-{int(time.time() * 1000)}.log"
        # TCP for the tests and clients that go straight to gunicorn (never a trusted proxy), the Unix
        # socket for nginx (deploy/nginx.conf), whose X-Forwarded-For the app believes
        env = {**os.environ, "GLASSBOX_BIND": f"{LOOPBACK}:{self.port},unix:{upstream_socket(self.port)}",
               "GLASSBOX_INSTANCE_PATH": str(self.instance), "GLASSBOX_TORCH_THREADS": "1", **self.env}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "wsgi:app"],
                                         cwd=self.root, env={**env, "PYTHONPATH": str(self.root)},
                                         stdout=log, stderr=subprocess.STDOUT)
        if not ready_timeout:  # the caller watches start-up itself
            return self
        if not wait_until(lambda: self.proc.poll() is not None or _status(self.url + "/readyz") == 200,
                          ready_timeout) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError(f"gunicorn did not become ready:\n{self.log()[-3000:]}")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def kill_9(self) -> None:
        """SIGKILL to the worker, then to the master: the process dies as a crash kills it, nothing saved on
        the way out (the master alone would leave its worker running, and then shut down cleanly)."""
        workers = [int(p) for task in Path(f"/proc/{self.proc.pid}/task").iterdir()
                   for p in (task / "children").read_text().split()]
        for pid in workers + [self.proc.pid]:
            os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            if self.wait(30) is None:
                self.proc.kill()
                self.proc.wait(5)

    def metrics(self) -> dict[str, float]:
        return parse_metrics(Client(self.url).get("/metrics").text)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value}."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def nginx_config(template: Path, prefix: Path, listen_port: int, upstream_port: int | list[int]) -> str:
    """deploy/nginx.conf inside a minimal main config whose pid, logs and temp files live in `prefix`.
    The deploy file's own `listen` line is replaced by a loopback test port, and its upstream `server`
    lines (one per front end) by the Unix sockets of the test gunicorns on `upstream_port` (one or several),
    each keeping the deploy line's parameters."""
    site = template.read_text()
    site, n_listen = re.subn(r"^(\s*)listen\s+[^;]+;", rf"\1listen {LOOPBACK}:{listen_port};", site, flags=re.M)
    servers = list(re.finditer(r"^(\s*)server\s+unix:/run/glassbox/\S+\.sock\b([^;\n]*);\n", site, flags=re.M))
    if n_listen != 1 or not servers:
        raise ValueError(f"{template}: expected one listen and upstream server lines, found "
                         f"{n_listen} and {len(servers)}")
    ports = upstream_port if isinstance(upstream_port, list) else [upstream_port]
    indent, options = servers[0].group(1), servers[0].group(2)
    lines = "".join(f"{indent}server unix:{upstream_socket(port)}{options};\n" for port in ports)
    site = site[:servers[0].start()] + lines + site[servers[-1].end():]
    temp = "\n".join(f"    {kind}_temp_path {prefix / kind};" for kind in
                     ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers must reach the tmp dirs
    return (f"{user}daemon off;\nworker_processes 1;\npid {prefix / 'nginx.pid'};\n"
            f"error_log {prefix / 'error.log'} info;\nevents {{ worker_connections 256; }}\n"
            f"http {{\n    include /etc/nginx/mime.types;\n    access_log {prefix / 'access.log'};\n{temp}\n"
            f"{site}\n}}\n")


@dataclass
class Nginx:
    """Real nginx in the foreground (`daemon off`), everything it writes under `prefix`."""

    prefix: Path
    upstream_port: int | list[int]  # one front end's port, or several (deploy/nginx.conf's upstream lists two)
    template: Path = ROOT / "deploy" / "nginx.conf"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self) -> Nginx:
        self.prefix.mkdir(parents=True, exist_ok=True)
        conf = self.prefix / "nginx.conf"
        conf.write_text(nginx_config(self.template, self.prefix, self.port, self.upstream_port))
        args = [NGINX, "-c", str(conf), "-p", str(self.prefix), "-e", str(self.prefix / "error.log")]
        check = subprocess.run(args + ["-t"], capture_output=True, text=True)
        if check.returncode:
            raise RuntimeError(f"nginx -t failed:\n{check.stderr}")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_until(lambda: _connectable(self.port), 10):
            self.stop()
            raise RuntimeError(f"nginx did not start:\n{(self.prefix / 'error.log').read_text()}")
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful: let workers finish
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _connectable(port: int) -> bool:
    try:
        socket.create_connection((LOOPBACK, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


# -- a browser-like client -------------------------------------------------------------------------
@dataclass
class Reply:
    status: int
    headers: dict
    text: str
    url: str


@dataclass
class SSEEvent:
    name: str
    data: str
    at: float  # time.monotonic() when its blank line arrived


class Client:
    """One browser: its own cookie jar (session, owner), the CSRF token sent as htmx sends it."""

    def __init__(self, base: str) -> None:
        """`base` may carry a sub-path (http://127.0.0.1:8080/glassbox): paths are taken under it,
        except those the app generated, which already start with it."""
        self.base = base.rstrip("/")
        parts = urllib.parse.urlsplit(self.base)
        self.origin, self.prefix = f"{parts.scheme}://{parts.netloc}", parts.path
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        self.csrf = ""

    def absolute(self, path: str) -> str:
        if path.startswith("http"):
            return path
        if self.prefix and (path == self.prefix or path.startswith(self.prefix + "/")):
            return self.origin + path
        return self.base + path

    def request(self, method: str, path: str, data: dict | None = None, *, htmx: bool = False,
                csrf: bool = True, headers: dict | None = None, body: bytes | None = None,
                timeout: float = 30) -> Reply:
        hdrs = dict(headers or {})
        if htmx:
            hdrs["HX-Request"] = "true"
        if csrf and self.csrf and method != "GET":
            hdrs["X-CSRF-Token"] = self.csrf
        if data is not None:
            body = urllib.parse.urlencode(data, doseq=True).encode()
            hdrs.setdefault("Content-Type", "application/x-www-form-urlencoded")
        req = urllib.request.Request(self.absolute(path), data=body, headers=hdrs, method=method)
        try:
            with self.opener.open(req, timeout=timeout) as response:
                reply = Reply(response.status, dict(response.headers), response.read().decode(), response.url)
        except urllib.error.HTTPError as error:
            reply = Reply(error.code, dict(error.headers), error.read().decode(), error.url)
        token = re.search(r'name="csrf_token" value="([^"]+)"', reply.text)
        if token:
            self.csrf = token.group(1)
        return reply

    def get(self, path: str, **kw) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, data: dict | None = None, **kw) -> Reply:
        return self.request("POST", path, data if data is not None else {}, **kw)

    def open_stream(self, path: str, timeout: float = 30) -> Stream:
        return Stream(self, path, timeout)


class Stream:
    """An SSE response read as EventSource does, recording when each event arrived."""

    def __init__(self, client: Client, path: str, timeout: float) -> None:
        url = urllib.parse.urlsplit(client.absolute(path))
        self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
        request = urllib.request.Request(client.absolute(path))
        client.jar.add_cookie_header(request)
        # Accept-Encoding as a browser sends it: a proxy that gzips the stream would hold it back.
        target = url.path + (f"?{url.query}" if url.query else "")  # the query too: a replay's ?pace=
        self.conn.request("GET", target, headers={"Accept": "text/event-stream", "Accept-Encoding": "gzip",
                                                    "Cookie": request.get_header("Cookie") or ""})
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.headers = dict(self.response.getheaders())
        self.comments = 0

    def events(self):
        """Yield SSEEvent until the server ends the stream."""
        name, data = "message", []
        while True:
            raw = self.response.readline()
            if not raw:
                return
            line = raw.decode().rstrip("\r\n")
            if line == "":
                if data:
                    yield SSEEvent(name, "\n".join(data), time.monotonic())
                name, data = "message", []
            elif line.startswith(":"):
                self.comments += 1
            else:
                key, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if key == "event":
                    name = value
                elif key == "data":
                    data.append(value)

    def close(self) -> None:
        """Hang up, as a closed tab does."""
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()


def stream_url(fragment: str) -> str:
    """The sse-connect URL in an HTML fragment (a chat reply or a Loop-lab run)."""
    match = re.search(r'sse-connect="([^"]+)"', fragment)
    if not match:
        raise AssertionError(f"no stream in fragment:\n{fragment[:2000]}")
    return match.group(1)
