"""Glassbox: chat with a small GPT and watch a looped transformer think, on one shared core."""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any

from flask import Flask, g, request
from werkzeug.exceptions import HTTPException
from werkzeug.routing import IntegerConverter

from webapp.config import ROOT, Settings
from webapp.core import InferenceCore
from webapp.core.metrics import LatencyHistogram
from webapp import instance
from webapp.core.jobs import CLIENT
from webapp.db import Database
from webapp.security import GlassboxSessions, NewSessions, TrustedProxies, check_csrf, csrf_token

log = logging.getLogger("glassbox")

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'; object-src 'none'")


def create_app(settings: Settings | None = None, *, models: dict[str, Any] | None = None,
               test_config: dict | None = None) -> Flask:
    """Build the app.  Tests pass their own settings and (small) models; otherwise the
    configured models are loaded here, so a broken checkpoint stops start-up."""
    settings = settings or Settings.from_env()
    app = Flask(__name__, template_folder=str(ROOT / "templates"), static_folder=str(ROOT / "static"),
                instance_path=settings.instance_path or str(ROOT / "instance"))
    # What cannot work stops start-up here, naming the file (webapp/instance.py), before any model
    # loads: a folder another Glassbox uses, a bad secret key file, a database that cannot be written.
    folder = instance.prepare(app.instance_path)
    lock = instance.InstanceLock(folder)
    try:
        secret = settings.secret_key or instance.secret_key(folder)
        db = Database(folder / "glassbox.sqlite3")
        db.open_checked()
    except BaseException:
        lock.release()
        raise
    app.config.update(SECRET_KEY=secret, MAX_CONTENT_LENGTH=settings.max_body_bytes, SESSION_COOKIE_HTTPONLY=True,
                      SESSION_COOKIE_SAMESITE="Lax", SESSION_COOKIE_NAME="glassbox_session",
                      PERMANENT_SESSION_LIFETIME=timedelta(days=settings.session_days), GLASSBOX=settings)
    app.config.update(test_config or {})
    app.session_interface = GlassboxSessions()
    # Ids in URLs are SQLite integers: a larger one matches no route (404), instead of overflowing (500).
    app.url_map.converters["int"] = SqliteInteger

    app.extensions["glassbox.db"] = db
    app.extensions["glassbox.lock"] = lock
    app.extensions["glassbox.latency"] = LatencyHistogram()
    app.extensions["glassbox.new_sessions"] = NewSessions(settings.max_new_sessions_per_minute)
    try:
        app.extensions["glassbox.core"] = core = _start_core(settings, models)
    except BaseException:
        lock.release()
        raise
    core.on_shutdown.extend([db.close, lock.release])  # a process that stops (or a test's app) frees the folder

    from webapp import pages
    from webapp.chat.views import bp as chat_bp
    from webapp.loops.views import api as loops_api_bp
    from webapp.loops.views import bp as loops_bp
    from webapp.web.ops import bp as ops_bp
    from webapp.v1 import bp as v1_bp  # OpenAI's API; also the API-key check of /api/loops (issue 13)
    for blueprint in (ops_bp, pages.bp, chat_bp, loops_bp, loops_api_bp, v1_bp):
        app.register_blueprint(blueprint)
    from webapp import prefs  # the colour theme each browser chose (issue 14)
    prefs.init_app(app)

    app.wsgi_app = TrustedProxies(app.wsgi_app, settings.forwarded_allow_ips)
    app.before_request(_before)
    app.after_request(_after)
    app.register_error_handler(HTTPException, pages.http_error)
    app.jinja_env.globals["csrf_token"] = csrf_token
    from webapp.chat import markdown
    markdown.init_app(app)
    return app


def _start_core(settings: Settings, models: dict[str, Any] | None) -> InferenceCore:
    from webapp.chat import service as chat_service
    from webapp.loops import service as loop_service
    load_seconds = {}
    if models is None:
        models = {}
        for name, load in (("chat", chat_service.load_model), ("loops", loop_service.load_model)):
            started = time.perf_counter()
            models[name] = load(settings)
            load_seconds[name] = time.perf_counter() - started
    warmups = {"chat": chat_service.warm_up, "loops": loop_service.warm_up}
    executors = {"chat": chat_service.executor, "loops": loop_service.executor}
    return InferenceCore(models, {name: executors[name](model, settings) for name, model in models.items()},
                         warmups={k: v for k, v in warmups.items() if k in models},
                         load_seconds=load_seconds, torch_threads=settings.torch_threads,
                         max_queue=settings.max_queue, max_jobs_per_owner=settings.max_jobs_per_owner,
                         max_jobs_per_client=settings.max_jobs_per_client)


class SqliteInteger(IntegerConverter):
    """<int:...> bounded to SQLite's INTEGER range."""

    def __init__(self, map, *args, **kwargs) -> None:
        kwargs.setdefault("max", 2**63 - 1)
        super().__init__(map, *args, **kwargs)


def _before() -> None:
    g.started = time.perf_counter()
    CLIENT.set(request.remote_addr or "")  # jobs created by this request count against this address
    check_csrf()


def _after(response):
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("X-Frame-Options", "DENY")
    if "started" in g and response.mimetype != "text/event-stream":
        from flask import current_app
        current_app.extensions["glassbox.latency"].observe(time.perf_counter() - g.started)
    return response
