"""Fixtures: a throwaway PostgreSQL cluster for the session, and `database_location`: the same test run on
a fresh SQLite file and on a fresh PostgreSQL database (a path or a URL, for webapp.db.open_database)."""

from __future__ import annotations

import os

import pytest

from tests.support.postgres import Cluster, require_postgres
from webapp.web.state import glassbox

# Where the apps the behaviour tests make (tests.conftest.make_app) keep their history: "sqlite" (the
# instance folder's file, the default) or "postgres" (a fresh database of the session's cluster each).
# `make test` runs the behaviour tests both ways.
APP_DATABASE = os.environ.get("GLASSBOX_TEST_DATABASE", "sqlite")
if APP_DATABASE not in ("sqlite", "postgres"):
    raise SystemExit(f"GLASSBOX_TEST_DATABASE={APP_DATABASE!r}: say sqlite or postgres")
_apps_cluster: list[Cluster] = []


@pytest.fixture(scope="session")
def postgres_cluster():
    cluster = Cluster(require_postgres()).start()
    try:
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture(scope="session", autouse=True)
def apps_on_postgres(request):
    """Under GLASSBOX_TEST_DATABASE=postgres, the cluster that make_app's databases are made in."""
    if APP_DATABASE == "postgres":
        _apps_cluster.append(request.getfixturevalue("postgres_cluster"))
    yield
    _apps_cluster.clear()


def app_rows(app, sql: str, *args) -> list[tuple]:
    """A statement on an app's own database, whichever it is (`?` placeholders) -> its rows as tuples."""
    with glassbox(app).db.transaction() as db:
        cursor = db.execute(sql, args)
        return [tuple(row) for row in cursor.fetchall()] if cursor.description is not None else []


def app_database_url() -> str:
    """For make_app: "" (SQLite in the instance folder) or a fresh PostgreSQL database's URL."""
    return _apps_cluster[0].new_database() if _apps_cluster else ""


@pytest.fixture
def postgres_url(request):
    """A fresh, empty PostgreSQL database, dropped after the test."""
    cluster = request.getfixturevalue("postgres_cluster")
    url = cluster.new_database()
    yield url
    cluster.drop_database(url)


@pytest.fixture(params=["sqlite", "postgres"])
def database_location(request, tmp_path) -> str:
    """A fresh database of each kind, not yet initialised: a SQLite file's path or a PostgreSQL URL."""
    if request.param == "sqlite":
        return str(tmp_path / "glassbox.sqlite3")
    return request.getfixturevalue("postgres_url")
