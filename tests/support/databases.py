"""Fixtures: a throwaway PostgreSQL cluster for the session, and `database_location`: the same test run on
a fresh SQLite file and on a fresh PostgreSQL database (a path or a URL, for webapp.db.open_database)."""

from __future__ import annotations

import pytest

from tests.support.postgres import Cluster, require_postgres


@pytest.fixture(scope="session")
def postgres_cluster():
    cluster = Cluster(require_postgres()).start()
    try:
        yield cluster
    finally:
        cluster.remove()


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
