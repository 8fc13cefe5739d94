"""A throwaway PostgreSQL cluster for the tests: Debian's server binaries, initdb in a temporary folder,
its own free port on loopback and its Unix socket in that folder, run as `nobody` when the tests run as
root (PostgreSQL refuses root). Each test that asks gets a database of its own (CREATE DATABASE).

The cluster runs with fsync off: the tests kill front ends, never the machine, and a commit is in the
server's memory once acknowledged whatever fsync says; initdb and CREATE DATABASE are far faster so."""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest

from tests.support.servers import free_port

USER = "glassbox"


def server_binaries() -> Path | None:
    """The newest installed PostgreSQL's bin folder (Debian: /usr/lib/postgresql/<major>/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def require_postgres() -> Path:
    binaries = server_binaries()
    if binaries is None:
        message = "PostgreSQL is not installed (make system-packages-test installs Debian's postgresql)"
        if os.environ.get("GLASSBOX_REQUIRE_SYSTEM_TESTS"):  # set by `make test`: never skip there
            pytest.fail(message)
        pytest.skip(message)
    return binaries


class Cluster:
    def __init__(self, binaries: Path, fsync: bool = False) -> None:
        self.binaries = binaries
        self.fsync = fsync  # on: as deployed (bench.store.load); off: the tests, faster
        self.folder = Path(tempfile.mkdtemp(prefix="glassbox-pg-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self._names = itertools.count(1)
        self._as_user: list[str] = []
        if os.getuid() == 0:  # the server will not run as root: the folder and the processes are nobody's
            shutil.chown(self.folder, "nobody", "nogroup")
            self._as_user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]

    def _run(self, *command: str) -> None:
        subprocess.run([*self._as_user, *command], check=True, capture_output=True, cwd=self.folder)

    def start(self) -> Cluster:
        if not self.data.exists():
            self._run(str(self.binaries / "initdb"), "-D", str(self.data), "-U", USER, "--auth=trust",
                      "-E", "UTF8", "--no-sync", "--locale=C")
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c max_connections=200"
        if not self.fsync:
            options += " -c fsync=off -c full_page_writes=off"
        self._run(str(self.binaries / "pg_ctl"), "-D", str(self.data), "-l", str(self.folder / "log"), "-w",
                  "-t", "60", "-o", options, "start")
        return self

    def stop(self) -> None:
        """Stop the server at once (running connections are ended), keeping its data for start()."""
        self._run(str(self.binaries / "pg_ctl"), "-D", str(self.data), "-w", "-m", "fast", "stop")

    def remove(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(self.folder, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@/{database}?host={self.folder}&port={self.port}"

    def tcp_url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self, tcp: bool = False) -> str:
        """A new empty database -> its URL (its Unix socket's, or with `tcp` its loopback port's)."""
        name = f"test_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        return self.tcp_url(name) if tcp else self.url(name)

    def drop_database(self, url: str) -> None:
        name = url.split("/")[3].split("?")[0]
        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
