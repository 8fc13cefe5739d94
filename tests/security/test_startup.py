"""Start-up refuses what cannot work, naming the file; instance files are private; the session cookie
has its own name, the app's path, Secure behind HTTPS and a documented lifetime."""

from __future__ import annotations

import os
import sqlite3
import stat

import pytest

from tests.support.loop_models import bundle
from webapp import create_app
from webapp.config import ConfigError, Settings
from webapp.web.state import glassbox


def start(instance, **overrides):
    settings = Settings(instance_path=str(instance), heartbeat_seconds=0.05, **overrides)
    return create_app(settings, models={"loops": bundle()}, test_config={"TESTING": True})


def stop(app):
    glassbox(app).core.shutdown(timeout=5)


@pytest.mark.parametrize("content, says", [(b"", "is empty"), (b"short", "is too short"),
                                           (b"\xff\xfe" * 40, "cannot be read")])
def test_a_bad_secret_key_file_stops_start_up_naming_it(tmp_path, content, says):
    instance = tmp_path / "instance"
    instance.mkdir()
    (instance / "secret_key").write_bytes(content)
    with pytest.raises(ConfigError, match=says) as error:
        start(instance)
    assert str(instance / "secret_key") in str(error.value)
    stop(start(instance, secret_key="an explicit key wins over the file"))  # and the lock was released


def test_a_secret_key_that_is_a_folder_stops_start_up(tmp_path):
    (tmp_path / "instance" / "secret_key").mkdir(parents=True)
    with pytest.raises(ConfigError, match="secret key file .* cannot be read"):
        start(tmp_path / "instance")


def test_a_short_secret_key_setting_is_refused():
    with pytest.raises(ConfigError, match="GLASSBOX_SECRET_KEY is too short"):
        Settings.from_env({"GLASSBOX_SECRET_KEY": "hunter2"})
    assert Settings.from_env({"GLASSBOX_SECRET_KEY": "x" * 16}).secret_key == "x" * 16


def test_a_second_glassbox_on_the_same_folder_is_refused(tmp_path):
    first = start(tmp_path / "instance")
    try:
        with pytest.raises(ConfigError, match=rf"already used by a running Glassbox \(pid {os.getpid()}") as error:
            start(tmp_path / "instance")
        assert str(tmp_path / "instance" / "glassbox.lock") in str(error.value)
    finally:
        stop(first)
    stop(start(tmp_path / "instance"))  # once the first has stopped, the folder is free


def test_an_unwritable_database_stops_start_up_naming_it(tmp_path):
    (tmp_path / "instance" / "glassbox.sqlite3").mkdir(parents=True)  # not a file: nothing can write it
    with pytest.raises(ConfigError, match="glassbox.sqlite3 cannot be"):
        start(tmp_path / "instance")


def test_instance_files_are_private(tmp_path):
    old = os.umask(0o022)  # the usual umask, which would make them world-readable
    try:
        app = start(tmp_path / "instance")
    finally:
        os.umask(old)
    try:
        instance = tmp_path / "instance"
        assert stat.S_IMODE(instance.stat().st_mode) == 0o700
        held = sqlite3.connect(instance / "glassbox.sqlite3")  # the -wal and -shm exist while one is open
        held.execute("INSERT OR REPLACE INTO write_probe VALUES (1, 0)")
        held.commit()
        for name in ("secret_key", "glassbox.lock", "glassbox.sqlite3", "glassbox.sqlite3-wal", "glassbox.sqlite3-shm"):
            assert stat.S_IMODE((instance / name).stat().st_mode) == 0o600, name
        assert (instance / "glassbox.lock").read_text().strip() == str(os.getpid())
        held.close()
    finally:
        stop(app)


def test_the_session_cookie_is_named_scoped_and_secure_behind_https(tmp_path):
    app = start(tmp_path / "instance")
    try:
        plain = app.test_client().get("/loops/").headers["Set-Cookie"]
        assert plain.startswith("glassbox_session=") and "Path=/;" in plain and "Secure" not in plain
        assert "HttpOnly" in plain and "SameSite=Lax" in plain and "Expires=" in plain
        proxied = app.test_client().get("/loops/", headers={"X-Forwarded-Prefix": "/glassbox",
                                                           "X-Forwarded-Proto": "https"},
                                        environ_base={"REMOTE_ADDR": ""}).headers["Set-Cookie"]  # Unix socket
        assert "Path=/glassbox;" in proxied and "Secure" in proxied
        spoofed = app.test_client().get("/loops/", headers={"X-Forwarded-Proto": "https"},
                                        environ_base={"REMOTE_ADDR": "192.0.2.1"}).headers["Set-Cookie"]
        assert "Secure" not in spoofed  # only a trusted proxy says the request came over HTTPS
        assert app.permanent_session_lifetime.days == 30
    finally:
        stop(app)


def test_huge_ids_in_urls_are_404_not_500(tmp_path):
    app = start(tmp_path / "instance")
    try:
        client = app.test_client()
        for path in (f"/chat/c/x/m/{2**63}/stream", f"/chat/c/x/m/{2**64}/tokens", f"/chat/c/x/m/{10**40}/prompt"):
            assert client.get(path).status_code == 404, path
    finally:
        stop(app)
