"""Glassbox: chat with a small GPT and watch a looped transformer think, on one shared core."""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any

from flask import Flask, g, request
from werkzeug.exceptions import HTTPException

from webapp.config import ROOT, Settings
from webapp.core import InferenceCore
from webapp.core.metrics import LatencyHistogram
from webapp.db import Database
from webapp.security import TrustedProxies, check_csrf, csrf_token

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
    Path(app.instance_path).mkdir(parents=True, exist_ok=True)
    app.config.update(SECRET_KEY=settings.secret_key or _instance_secret(app.instance_path),
                      MAX_CONTENT_LENGTH=settings.max_body_bytes, SESSION_COOKIE_HTTPONLY=True,
                      SESSION_COOKIE_SAMESITE="Lax", GLASSBOX=settings)
    app.config.update(test_config or {})

    db = Database(Path(app.instance_path) / "glassbox.sqlite3")
    db.init()
    app.extensions["glassbox.db"] = db
    app.extensions["glassbox.latency"] = LatencyHistogram()
    app.extensions["glassbox.core"] = _start_core(settings, models)

    from webapp import pages
    from webapp.chat.views import bp as chat_bp
    from webapp.loops.views import api as loops_api_bp
    from webapp.loops.views import bp as loops_bp
    from webapp.web.ops import bp as ops_bp
    for blueprint in (ops_bp, pages.bp, chat_bp, loops_bp, loops_api_bp):
        app.register_blueprint(blueprint)

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
                         max_queue=settings.max_queue, max_jobs_per_owner=settings.max_jobs_per_owner)


def _instance_secret(instance_path: str) -> str:
    # One key per installation, so sessions survive restarts without any configuration.
    path = Path(instance_path) / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_hex(32))
        path.chmod(0o600)
    return path.read_text().strip()


def _before() -> None:
    g.started = time.perf_counter()
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
