"""Real gunicorn (gunicorn.conf.py) and real nginx (deploy/nginx.conf) on free loopback ports, with
the small slow test models of tests/support/served_models.py."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.support.servers import NGINX, Gunicorn, Nginx, model_env


def require_nginx() -> None:
    if not shutil.which("nginx") and not os.path.exists(NGINX):
        if os.environ.get("GLASSBOX_REQUIRE_SYSTEM_TESTS"):  # set by `make test`: never skip there
            pytest.fail("nginx is not installed (make system-packages)")
        pytest.skip("nginx is not installed (make system-packages)")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """gunicorn behind nginx; chat replies take 50 ms a token, loops 50 ms a loop."""
    require_nginx()
    work = tmp_path_factory.mktemp("stack")
    app = Gunicorn(work / "instance", model_env(work, chat_arch="tiny:0.05", loop_delay=0.05)).start()
    proxy = Nginx(work / "nginx", app.port)
    try:
        proxy.start()
        yield app, proxy
    finally:
        proxy.stop()
        app.stop()
