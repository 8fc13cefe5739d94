"""The instance folder (database, secret key, lock): made private, claimed by one process, checked
at start-up so that what cannot work stops the app with a message naming the file, not a 500 later."""

from __future__ import annotations

import fcntl
import os
import secrets
from pathlib import Path

from webapp.config import ConfigError

MIN_SECRET_FILE_CHARS = 32  # the generated key is 64 hex characters
LOCK_NAME = "glassbox.lock"


def prepare(path: str | Path) -> Path:
    """The instance folder, created 0700 when it does not exist (it holds everyone's conversations)."""
    folder = Path(path)
    if not folder.exists():
        folder.mkdir(parents=True, mode=0o700)
        folder.chmod(0o700)  # mkdir's mode is filtered by the umask
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"The instance folder {folder} is not writable by this user (GLASSBOX_INSTANCE_PATH)")
    return folder


class NoLock:
    """With PostgreSQL several front ends share the database, each with its own instance folder: no lock."""

    def release(self) -> None:
        pass


class InstanceLock:
    """An exclusive flock on <instance>/glassbox.lock, holding the owner's pid, for the process's life.

    Two Glassboxes on one folder would each mark the other's running replies as stopped at start-up
    and write the same database; the second one is refused instead. The kernel drops the lock when
    the process dies, even by kill -9, so a stale file never blocks a restart."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK_NAME
        self.fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "another process"
            os.close(self.fd)
            raise ConfigError(f"The instance folder {folder} is already used by a running Glassbox (pid {holder}, "
                              f"lock file {self.path}). Stop it, or set GLASSBOX_INSTANCE_PATH to another folder.")
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None


def _kept_random(path: Path, nbytes: int, what: str) -> str:
    """A random hex string made once (0600: never readable by others, not even briefly) and read back on
    every start from then on."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as file:
            file.write(secrets.token_hex(nbytes))
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"The {what} file {path} cannot be read: {error}") from None


def front_end_id(folder: Path) -> str:
    """This front end's id, recorded with each reply it runs (webapp/chat/store.py): random, made once and
    kept in <instance>/front_end_id, so that a restarted front end knows its own replies."""
    path = folder / "front_end_id"
    found = _kept_random(path, 6, "front-end id")
    if not found:
        raise ConfigError(f"The front-end id file {path} is empty: delete it to have a new one made.")
    return found


def secret_key(folder: Path) -> str:
    """One key per installation, kept in <instance>/secret_key (0600), so sessions survive restarts."""
    path = folder / "secret_key"
    key = _kept_random(path, 32, "secret key")
    if len(key) < MIN_SECRET_FILE_CHARS:
        raise ConfigError(f"The secret key file {path} is {'empty' if not key else 'too short'}: it needs at least "
                          f"{MIN_SECRET_FILE_CHARS} characters. Delete it to have a new one generated "
                          "(everyone's session cookie then changes).")
    return key
