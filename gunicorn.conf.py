"""gunicorn settings for Glassbox: one process (one copy of the models, one owner of the
device), gthread workers so long-lived streams stay open, threads sized for streams + pages."""

import os
import threading

bind = os.environ.get("GLASSBOX_BIND", "127.0.0.1:8000")
workers = 1                       # the models and the job queue live in this one process
worker_class = "gthread"          # the sync worker would kill streams at `timeout`
# Every open stream holds a thread; keep some over GLASSBOX_MAX_STREAMS for page loads.
threads = int(os.environ.get("GLASSBOX_THREADS", "32"))
timeout = 120                     # the worker's heartbeat; streams are not bound by it under gthread
graceful_timeout = int(os.environ.get("GLASSBOX_GRACEFUL_TIMEOUT", "20"))
keepalive = 5
accesslog = "-"
errorlog = "-"
loglevel = os.environ.get("GLASSBOX_LOG_LEVEL", "info")
# No message text in logs: method, path, status, size, duration only.
access_log_format = '%(h)s "%(m)s %(U)s" %(s)s %(B)s %(M)sms'
forwarded_allow_ips = os.environ.get("GLASSBOX_FORWARDED_ALLOW_IPS", "127.0.0.1")


def when_ready(server):
    server.log.info("Glassbox is listening on http://%s/", bind)


def post_worker_init(worker):
    """On SIGTERM, stop the core first: it cancels running jobs (partial replies are saved as
    stopped) and every open stream ends with its final event, so the worker can exit in time."""
    import signal

    original = worker.handle_exit

    def handle_exit(sig, frame):
        original(sig, frame)
        core = worker.wsgi.extensions.get("glassbox.core") if hasattr(worker.wsgi, "extensions") else None
        if core is not None:
            threading.Thread(target=core.shutdown, name="glassbox-shutdown", daemon=True).start()

    worker.handle_exit = handle_exit
    signal.signal(signal.SIGTERM, handle_exit)
