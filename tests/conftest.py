"""Shared fixtures: an app on a temporary instance folder, with models the test chooses."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from webapp import create_app
from webapp.config import Settings
from webapp.web.state import glassbox

# the PostgreSQL cluster and the database_location fixture (every store test on SQLite and PostgreSQL)
pytest_plugins = ["tests.support.databases"]

ROOT = Path(__file__).resolve().parent.parent


def make_app(tmp_path, models, **overrides):
    from tests.support.databases import app_database_url  # here: a plugin (pytest_plugins) is imported by pytest

    overrides.setdefault("database_url", app_database_url())  # GLASSBOX_TEST_DATABASE=postgres: PostgreSQL
    settings = Settings(instance_path=str(tmp_path / "instance"), secret_key="test-secret",
                        heartbeat_seconds=0.05, **overrides)
    app = create_app(settings, models=models, test_config={"TESTING": True})
    glassbox(app).core.ready.wait(10)
    return app


def csrf_of(client, path="/") -> str:
    page = client.get(path).get_data(as_text=True)
    return re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


def sse_events(text: str) -> list[tuple[str, str]]:
    """Parse an SSE body as EventSource does."""
    events, name, data = [], "message", []
    for line in re.split(r"\r\n|\r|\n", text):
        if line == "":
            if data:
                events.append((name, "\n".join(data)))
            name, data = "message", []
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
    return events


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def loop_app(tmp_path):
    from tests.support.loop_models import bundle
    app = make_app(tmp_path, {"loops": bundle()})
    yield app
    glassbox(app).core.shutdown()


@pytest.fixture
def chat_app(tmp_path):
    from tests.support.chat_models import tiny_chat_model
    from tests.support.loop_models import bundle
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat"), "loops": bundle()})
    yield app
    glassbox(app).core.shutdown()


@pytest.fixture
def slow_chat_app(tmp_path):
    """Replies that take a while (20 ms a step), for Stop, disconnects and the queue."""
    from tests.support.chat_models import tiny_chat_model
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat", seconds_per_step=0.02)})
    yield app
    glassbox(app).core.shutdown()
