"""Fixtures for /v1: an app on the tiny test chat model, with or without API keys."""

from __future__ import annotations

import pytest

from tests.conftest import make_app
from webapp.web.state import glassbox

KEY = "test-key-0123456789abcdef"
OTHER_KEY = "other-key-0123456789abcdef"


def write_keys(path, *keys: str):
    path.write_text("# keys for the tests\n\n" + "".join(f"{k}  someone\n" for k in keys))
    return path


@pytest.fixture
def api_app(tmp_path):
    from tests.support.chat_models import tiny_chat_model
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat")})
    yield app
    glassbox(app).core.shutdown()


@pytest.fixture
def keyed_app(tmp_path):
    """Keys required; the Loop lab too, to check its JSON API asks for the same key."""
    from tests.support.chat_models import tiny_chat_model
    from tests.support.loop_models import bundle
    keys = write_keys(tmp_path / "api_keys", KEY, OTHER_KEY)
    app = make_app(tmp_path, {"chat": tiny_chat_model(tmp_path / "chat"), "loops": bundle()}, api_keys=str(keys))
    yield app
    glassbox(app).core.shutdown()


def submitted_jobs(app) -> list:
    """Record the jobs the core is given (their owners, their requests)."""
    core = glassbox(app).core
    seen, submit = [], core.submit

    def recording(job):
        seen.append(job)
        return submit(job)
    core.submit = recording
    return seen


SCRIPT = "The capital of France is Paris. Ünïcödé ✓ END here"


def scripted_chat_model(directory, text: str = SCRIPT):
    """The tiny GPT forced to say `text`, then <|assistant_end|> (tests/support/served_models.py)."""
    from tests.support.chat_models import tiny_checkpoint
    from webapp.chat.model.loading import load_chat_model
    return load_chat_model(str(tiny_checkpoint(directory)), factory="tests.support.served_models:build_chat_model",
                           arch="script:" + text.encode().hex())


@pytest.fixture
def script_app(tmp_path):
    app = make_app(tmp_path, {"chat": scripted_chat_model(tmp_path / "chat")})
    yield app
    glassbox(app).core.shutdown()
