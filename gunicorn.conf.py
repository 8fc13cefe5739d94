"""gunicorn settings for Glassbox: one process (one copy of the models, one owner of the
device), gthread workers so long-lived streams stay open, threads sized for streams + pages.

On SIGTERM (systemd stop, deploys) the worker stops taking connections, the core stops taking jobs
and cancels the queued and running ones (partial replies are saved as stopped), every open stream
ends with its final `done` event, and the worker exits well within graceful_timeout.
"""

import ipaddress
import os
import signal
import sys
import threading


# Loopback by default: gunicorn alone gives every connection a thread, so slow or idle clients can hold
# them all. Beyond one machine, nginx (deploy/nginx.conf) takes the connections and gunicorn stays here.
# One address or several, comma-separated: `127.0.0.1:8000`, `unix:/run/glassbox/gunicorn.sock` (how
# deploy/nginx.conf reaches it: a socket only the glassbox group may open, so no other local process
# can pose as the proxy), or both.
def refuse(message: str) -> None:
    """A setting gunicorn reads that cannot work: one line naming it, and no start (exit status 2)."""
    sys.stderr.write(f"Glassbox cannot start: {message}\n")
    sys.exit(2)


def whole_number(name: str, default: str, low: int, high: int) -> int:
    raw = os.environ.get(name) or default
    try:
        value = int(raw.strip())
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        refuse(f"{name}={raw!r} is not allowed: use a whole number from {low} to {high}")
    return value


def bind_addresses(raw: str) -> list[str]:
    addresses = [a.strip() for a in raw.split(",") if a.strip()]
    for address in addresses:
        if address.startswith(("unix:", "fd://")):
            continue
        port = address.rpartition(":")[2]
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            refuse(f"GLASSBOX_BIND={raw!r}: {address!r} needs a port from 1 to 65535 (host:port, or unix:/path)")
    if not addresses:
        refuse(f"GLASSBOX_BIND={raw!r} names no address (host:port, or unix:/path)")
    return addresses


bind = bind_addresses(os.environ.get("GLASSBOX_BIND", "127.0.0.1:8000"))
umask = 0o007                     # applied to the Unix socket only: owner and group may connect, others not
workers = 1                       # the models and the job queue live in this one process
worker_class = "gthread"          # the sync worker would kill streams at `timeout`
# Every open stream holds a thread. The app refuses streams over GLASSBOX_MAX_STREAMS, so threads
# beyond that are kept for page loads, which would otherwise queue behind streams.
PAGE_THREADS = 8
# A room's followers have their own slots (GLASSBOX_MAX_FOLLOWER_STREAMS), each a thread too.
STREAM_THREADS = (whole_number("GLASSBOX_MAX_STREAMS", "24", 1, 10_000)
                  + whole_number("GLASSBOX_MAX_FOLLOWER_STREAMS", "100", 0, 10_000))
threads = whole_number("GLASSBOX_THREADS", str(STREAM_THREADS + PAGE_THREADS), 1, 30_000)
timeout = 120                     # the worker's heartbeat; streams are not bound by it under gthread
graceful_timeout = whole_number("GLASSBOX_GRACEFUL_TIMEOUT", "20", 1, 3600)
keepalive = 5                     # nginx keeps upstream connections open (deploy/nginx.conf); idle ones close
# What one request's head may hold (gunicorn answers 400/431 past these): a URL, a few dozen headers, a cookie.
limit_request_line = 4094
limit_request_fields = 50
limit_request_field_size = 8190
# No TCP peer is a proxy unless named (a Unix socket's peer always is, as in the app: webapp/web/security.py)
forwarded_allow_ips = os.environ.get("GLASSBOX_FORWARDED_ALLOW_IPS", "")
control_socket_disable = True     # gunicorn >= 24's control socket is one path per user: instances collide

# Logs go to stderr (journald under systemd), one line per request and one per job. Key=value lines
# that grep and log shippers read; never a message's text: paths carry ids only, queries are left out.
accesslog = "-"
errorlog = "-"
loglevel = os.environ.get("GLASSBOX_LOG_LEVEL", "info")
access_log_format = ('remote=%(h)s forwarded_for="%({x-forwarded-for}i)s" method=%(m)s path="%(U)s" '
                     'status=%(s)s bytes=%(B)s ms=%(M)s')
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain",
                            "stream": "ext://sys.stderr"}},
    "root": {"level": "WARNING", "handlers": ["stderr"]},  # gunicorn merges ours over its defaults
    "loggers": {
        "gunicorn.error": {"level": loglevel.upper(), "handlers": ["stderr"], "propagate": False},
        "gunicorn.access": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
        "glassbox": {"level": loglevel.upper(), "handlers": ["stderr"], "propagate": False},
    },
}


def exposure(address: str, trusted_proxies: str) -> tuple[str, str]:
    """-> (log level, what to say at start-up) for a bind address and GLASSBOX_FORWARDED_ALLOW_IPS."""
    if address.startswith(("unix:", "fd://")):
        return "info", "on a local socket: only a proxy on this host reaches it"
    host = address.rpartition(":")[0].strip("[]") if ":" in address else address
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if loopback:
        return "info", "on loopback only: other machines reach it through nginx (deploy/nginx.conf)"
    proxies = [p.strip() for p in trusted_proxies.split(",") if p.strip()]
    remote_proxy = any(p != "*" and not _is_loopback(p) for p in proxies)  # "*" names no proxy
    if remote_proxy:
        return "info", f"reachable from other machines; requests are expected through the proxy at {trusted_proxies}"
    return "warning", ("REACHABLE FROM OTHER MACHINES WITHOUT A PROXY: gunicorn alone gives every connection a "
                       "thread, so a few slow or idle clients can stall every page. Bind 127.0.0.1 "
                       "(GLASSBOX_BIND) and serve through nginx (deploy/nginx.conf), or set "
                       "GLASSBOX_FORWARDED_ALLOW_IPS to the proxy in front")


def _is_loopback(network: str) -> bool:
    try:
        return ipaddress.ip_network(network, strict=False).is_loopback
    except ValueError:
        return False


def on_starting(server):
    """Every GLASSBOX_* setting checked before the worker is forked: a nonsense one (GLASSBOX_MAX_BATCH=0) is one
    line and exit status 2, where the worker's start used to print it under a traceback and gunicorn's own lines.
    webapp/config.py is read alone, not as part of the webapp package: importing that would load torch into this
    master process, which never runs a model."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("glassbox_settings", os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "webapp", "config.py"))
    config = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(config)
    try:
        config.Settings.from_env()
    except config.ConfigError as error:
        refuse(str(error))


def when_ready(server):
    # what gunicorn really bound: `-b` on the command line, or several -b, win over `bind` above
    for sock in server.LISTENERS:
        address = str(sock)
        level, said = exposure(address.removeprefix("http://"), forwarded_allow_ips)
        getattr(server.log, level)("Glassbox is listening on %s %s", address, said)


def _core(worker):
    # worker.wsgi is the Flask app itself (proxy handling wraps app.wsgi_app, not the app)
    state = getattr(worker.wsgi, "extensions", {}).get("glassbox")  # the app's state (webapp/web/state.py)
    return getattr(state, "core", None)


def post_worker_init(worker):
    """Chain the core's shutdown onto the worker's SIGTERM handler (gunicorn has no hook there)."""
    core = _core(worker)
    if core is None:
        worker.log.warning("no Glassbox core found: SIGTERM will not end streams early")
        return
    stop_accepting = worker.handle_exit

    def handle_exit(sig, frame):
        stop_accepting(sig, frame)
        # Not in the signal handler itself: shutdown waits for the running job to stop.
        threading.Thread(target=core.shutdown, kwargs={"timeout": graceful_timeout / 2},
                         name="glassbox-shutdown", daemon=True).start()

    signal.signal(signal.SIGTERM, handle_exit)
    signal.siginterrupt(signal.SIGTERM, False)  # as gunicorn set it: requests are not interrupted


def worker_int(worker):
    """SIGINT/SIGQUIT (Ctrl-C): a fast exit, but the partial replies are still saved as stopped."""
    core = _core(worker)
    if core is not None:
        core.shutdown(timeout=2)
