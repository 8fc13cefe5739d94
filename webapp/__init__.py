"""Glassbox: chat with a small GPT and watch a looped transformer think, on one shared core."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable
from datetime import timedelta
from types import ModuleType
from typing import Any

import psycopg
from flask import Flask, g, request
from werkzeug.exceptions import HTTPException
from werkzeug.routing import IntegerConverter

from webapp import instance
from webapp.browsers import Browsers
from webapp.chat import boot as chat_boot
from webapp.chat import experiments
from webapp.chat.registry import ChatModels
from webapp.chat.web import bp as chat_bp
from webapp.chat.web import markdown
from webapp.chat.web import present as chat_present
from webapp.config import ROOT, Settings
from webapp.core import InferenceCore
from webapp.core.executors import Executor
from webapp.core.jobs import CLIENT
from webapp.db import open_database
from webapp.loops import boot as loops_boot
from webapp.loops.runs import BATCHED as BATCHED_LOOPS
from webapp.loops.web import api as loops_api_bp
from webapp.loops.web import bp as loops_bp
from webapp.loops.web import present as loops_present
from webapp.present import PresentLinks
from webapp.v1 import bp as v1_bp
from webapp.web import bodies, heavy, pages, prefs, retention, storage_errors, wording
from webapp.web.api_keys import load as load_api_keys
from webapp.web.counts import HeavyReads, NewSessions
from webapp.web.follow import bp as follow_bp
from webapp.web.follow import short as follow_short_bp
from webapp.web.ops import bp as ops_bp
from webapp.web.security import GlassboxSessions, TrustedProxies, check_csrf, csrf_token
from webapp.web.state import Glassbox, glassbox

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
    # loads: a folder another Glassbox uses, a bad secret key file, a database that cannot be written
    # or reached. With PostgreSQL, several front ends share the database (each its own folder): no lock.
    folder = instance.prepare(app.instance_path)
    lock = instance.NoLock() if settings.database_url else instance.InstanceLock(folder)
    try:
        secret = settings.secret_key or instance.secret_key(folder)
        db = open_database(settings.database_url or str(folder / "glassbox.sqlite3"),
                           runner=instance.front_end_id(folder), timeout=settings.database_timeout)
        db.open_checked()
        api_keys = load_api_keys(settings)  # a bad keys file stops start-up, like a bad checkpoint
    except BaseException:
        lock.release()
        raise
    if settings.database_url and not settings.secret_key:  # a key of its own: a browser is new on another one
        log.warning("GLASSBOX_DATABASE_URL is set but GLASSBOX_SECRET_KEY is not: this front end signs cookies "
                    "with its own key (%s), so a browser sent to another front end starts afresh there. Give "
                    "every front end the same GLASSBOX_SECRET_KEY.", folder / "secret_key")
    app.config.update(SECRET_KEY=secret, MAX_CONTENT_LENGTH=settings.max_body_bytes, SESSION_COOKIE_HTTPONLY=True,
                      SESSION_COOKIE_SAMESITE="Lax", SESSION_COOKIE_NAME="glassbox_session",
                      PERMANENT_SESSION_LIFETIME=timedelta(days=settings.session_days), GLASSBOX=settings)
    app.config.update(test_config or {})
    app.session_interface = GlassboxSessions()
    # Ids in URLs are 64-bit integers (SQLite's, PostgreSQL's BIGINT): a larger one matches no route (404),
    # instead of overflowing (500).
    app.url_map.converters["int"] = SqliteInteger

    try:
        core, chat_models = _start_core(settings, models)
    except BaseException:
        lock.release()
        raise
    core.on_shutdown.extend([db.close, lock.release])  # a process that stops (or a test's app) frees the folder

    chat = chat_boot.service(core, db, chat_models, settings.max_messages)
    loops = loops_boot.service(core, db)
    sweeps = loops_boot.sweeps(loops, settings)
    # The one application state (webapp/web/state.py), read through glassbox()
    app.extensions["glassbox"] = Glassbox(db=db, browsers=Browsers(db), lock=lock, core=core,
                                          new_sessions=NewSessions(settings.max_new_sessions_per_minute),
                                          api_keys=api_keys,
                                          heavy_reads=HeavyReads(settings.heavy_read_bytes_per_second),
                                          services=(chat, *experiments.services(core, chat, settings), loops,
                                                    sweeps),
                                          stores=(chat.store, loops.store, PresentLinks(db)),
                                          followers={chat_present.KIND: chat_present.FOLLOWER,
                                                     loops_present.KIND: loops_present.FOLLOWER})

    # the API blueprints (/v1, /api/loops) put the API-key check in front of their own routes
    for blueprint in (ops_bp, pages.bp, chat_bp, loops_bp, loops_api_bp, v1_bp, follow_bp, follow_short_bp):
        app.register_blueprint(blueprint)
    prefs.init_app(app)  # the colour theme each browser chose

    app.wsgi_app = TrustedProxies(  # type: ignore[method-assign]
        bodies.ReadableBodies(app.wsgi_app), settings.forwarded_allow_ips)
    app.before_request(_before)
    app.before_request(retention.before_request)  # a browser's visit of the day; the idle browsers' rows
    app.after_request(_after)
    app.register_error_handler(HTTPException, pages.http_error)
    app.register_error_handler(sqlite3.OperationalError, storage_errors.database_error)  # disk full: 507
    app.register_error_handler(psycopg.Error, storage_errors.postgres_error)  # unreachable: 503
    app.jinja_env.globals["csrf_token"] = csrf_token
    markdown.init_app(app)
    wording.init_app(app)
    return app


def _start_core(settings: Settings, models: dict[str, Any] | None) -> tuple[InferenceCore, ChatModels]:
    """Load the models (unless given), give each its executor and warm-up (webapp/chat/boot.py,
    webapp/loops/boot.py), and start the core's worker. Each chat model of the registry has its own
    kinds of job (its replies, each experiment's jobs), so its replies step in a batch of their own."""
    load_seconds = {}
    if models is None:
        models = {}
        for name, load in (("chat", chat_boot.load_models), ("loops", loops_boot.load_model)):
            started = time.perf_counter()
            models[name] = load(settings)
            load_seconds[name] = time.perf_counter() - started
    chat = chat_boot.as_registry(models.get("chat"))
    core_models: dict[str, Any] = {}
    executors: dict[str, Executor] = {}
    warmups: dict[str, Callable[[Any], None]] = {}
    for name in chat.names():
        kind, loaded = chat.kind(name), chat.get(name)
        core_models[kind] = loaded
        executors[kind] = chat_boot.executor(loaded, chat.settings_for(name, settings))
        for experiment in experiments.EXPERIMENTS:  # Inside, attribution, ablation, ... (webapp/chat/experiments.py)
            executors[chat.job_kind(experiment.work, name)] = experiment.executor_for(loaded, chat_boot.prefix_cache)
        warmups[kind] = _warm_up(chat_boot)
    if "loops" in models:
        core_models["loops"] = models["loops"]
        executors["loops"] = runs = loops_boot.executor(models["loops"], settings)
        batch = loops_boot.batch_executor(runs)  # runs of a model that can, stepped together
        if batch is not None:
            executors[BATCHED_LOOPS] = batch
        warmups["loops"] = _warm_up(loops_boot)
    core = InferenceCore(core_models, executors, warmups=warmups,
                         load_seconds=load_seconds, torch_threads=settings.torch_threads,
                         max_queue=settings.max_queue, max_jobs_per_owner=settings.max_jobs_per_owner,
                         max_jobs_per_client=settings.max_jobs_per_client, bulk_share=settings.bulk_share)
    return core, chat


def _warm_up(boot: ModuleType) -> Callable[[Any], None]:
    # looked up at call time, so a test can put its own warm-up in place
    return lambda model: boot.warm_up(model)


class SqliteInteger(IntegerConverter):
    """<int:...> bounded to SQLite's INTEGER range."""

    def __init__(self, map, *args, **kwargs) -> None:
        kwargs.setdefault("max", 2**63 - 1)
        super().__init__(map, *args, **kwargs)


def _before() -> None:
    g.started = time.perf_counter()
    g.cpu_started = time.thread_time()  # a bulk request's CPU counts against the bulk share (web/heavy.py)
    CLIENT.set(request.remote_addr or "")  # jobs created by this request count against this address
    bodies.apply_body_limit()  # before the CSRF check reads the form
    bodies.refuse_chunked_over_limit()
    check_csrf()
    bodies.refuse_lone_surrogates()


def _after(response):
    bodies.drain_unread()  # whatever the answer, the connection stays usable for the next request
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("X-Frame-Options", "DENY")
    if "started" in g and response.mimetype != "text/event-stream":
        glassbox().latency.observe(time.perf_counter() - g.started)
    heavy.charge_bulk_request()
    return response
