"""Locks runs of one database share: first-time setup, the host's measuring turn and a study's claim
on its next trial.

measure_turn(url, host): the runs on one host take turns measuring (two runs timing at once on the
same cores or GPU would each measure the other's load). SQLite: an flock on a file in the user's
runtime (else temp) directory, named by the host: every run on this host, whatever database it
writes, waits for the same turn. PostgreSQL: a session advisory lock keyed by the host name, on a
connection of its own.

study_claim(url, study): checking which configurations the study's live runs are measuring and
recording the next trial happen as one step, so two runs never begin the same configuration (or two
baselines) at once. SQLite: an flock on '<file>-claims'; PostgreSQL: an advisory lock keyed by the
study name.

Both wait in short polls, so a signal handler that asks to stop (`should_stop`) is heard while
waiting; a stop raises KeyboardInterrupt like a Ctrl-C.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from sqlalchemy import create_engine, text
from sqlalchemy.exc import DatabaseError
from sqlalchemy.engine import make_url

from autoopt.errors import StoreError
from autoopt.store.db import DEFAULT_BUSY_TIMEOUT_S, _PG_SETUP_LOCK_KEY, display_url, first_line, sqlite_path

try:  # POSIX only; without it concurrent first-time creation of a SQLite file is not serialised
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

POLL_S = 0.05  # how often a waiter tries a lock again (file_lock, pg_advisory_lock)
_TURN_NAMESPACE, _CLAIM_NAMESPACE = 0x6175, 0x6176  # advisory-lock key prefixes ("au", "av")


def lock_dir() -> Path:
    """Where host-wide lock files live: $XDG_RUNTIME_DIR when set, else the temp directory."""
    return Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())


def turn_file(host: str) -> Path:
    return lock_dir() / f"autoopt-measure-{_safe(host)}.lock"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:100] or "host"


def _key(namespace: int, name: str) -> int:
    """A signed 64-bit advisory-lock key: the namespace in the top bits, a hash of `name` below."""
    digest = int.from_bytes(hashlib.sha256(name.encode()).digest()[:6], "big")
    key = (namespace << 48) | digest
    return key - (1 << 64) if key >= 1 << 63 else key


def _never() -> bool:
    return False


@contextlib.contextmanager
def measure_turn(url: str, host: str, should_stop: Callable[[], bool] = _never) -> Iterator[None]:
    """This host's measuring turn (see the module docstring)."""
    if sqlite_path(url) is None:
        with _pg_lock(url, _key(_TURN_NAMESPACE, host), f"the measuring turn of host {host}", should_stop):
            yield
        return
    with _file_lock(turn_file(host), should_stop):
        yield


@contextlib.contextmanager
def study_claim(url: str, study: str, should_stop: Callable[[], bool] = _never) -> Iterator[None]:
    """The right to record the study's next trial (see the module docstring)."""
    path = sqlite_path(url)
    if path is None:
        with _pg_lock(url, _key(_CLAIM_NAMESPACE, study), f"study {study!r}", should_stop):
            yield
        return
    with _file_lock(Path(f"{path}-claims"), should_stop):
        yield


def _stopper(should_stop: Callable[[], bool]) -> Callable[[], None]:
    def give_up() -> None:
        if should_stop():
            raise KeyboardInterrupt
    return give_up


def _file_lock(path: Path, should_stop: Callable[[], bool]) -> Any:
    return file_lock(path, _stopper(should_stop))


def _pg_lock(url: str, key: int, what: str, should_stop: Callable[[], bool]) -> Any:
    return pg_advisory_lock(url, key, what, _stopper(should_stop))


@contextlib.contextmanager
def setup_lock(url: str, timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> Iterator[None]:
    """Serialise first-time setup (our migrations, Optuna's table creation) of one database across
    processes: SQLite with an flock on '<file>-lock'; PostgreSQL with a session advisory lock (two
    processes creating Optuna's tables at once otherwise clash on CREATE TYPE: found by
    tests/test_postgres.py). Other back-ends: no lock."""
    if make_url(url).get_backend_name() == "postgresql":
        with _pg_setup_lock(url, timeout_s):
            yield
        return
    path = sqlite_path(url)
    if path is None or fcntl is None:
        yield
        return
    lock_path = Path(f"{path}-lock")
    deadline = time.monotonic() + timeout_s

    def give_up() -> None:
        if time.monotonic() > deadline:
            raise StoreError(f"database {display_url(url)}: another process holds {lock_path} "
                             f"for more than {timeout_s:.0f} s")
    with file_lock(lock_path, give_up):
        yield


@contextlib.contextmanager
def file_lock(path: Path, give_up: Any) -> Iterator[None]:
    """An flock on `path` (created if missing), polled: `give_up()` is called between polls and
    raises to stop waiting. Without fcntl (Windows): no lock."""
    if fcntl is None:
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise StoreError(f"cannot create lock file {path}: {exc.strerror}") from None
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                give_up()
                time.sleep(POLL_S)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _pg_setup_lock(url: str, timeout_s: float) -> Iterator[None]:
    deadline = time.monotonic() + timeout_s

    def give_up() -> None:
        if time.monotonic() > deadline:
            raise StoreError(f"database {display_url(url)}: another process has been setting it up for "
                             f"more than {timeout_s:.0f} s")
    with pg_advisory_lock(url, _PG_SETUP_LOCK_KEY, "its first-time setup", give_up):
        yield


@contextlib.contextmanager
def pg_advisory_lock(url: str, key: int, what: str, give_up: Any) -> Iterator[None]:
    """A PostgreSQL session advisory lock on a connection of its own, polled (`give_up()` is called
    between polls and raises to stop waiting); released on exit, or with the connection."""
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 10})
    conn = None
    try:
        try:
            conn = engine.connect()
            while not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
                conn.rollback()
                give_up()
                time.sleep(POLL_S)
            conn.commit()
        except DatabaseError as exc:
            raise StoreError(f"database {display_url(url)}: cannot take the lock on {what}: "
                             f"{first_line(exc)}") from None
        try:
            yield
        finally:
            with contextlib.suppress(DatabaseError):
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()
    finally:
        if conn is not None:
            conn.close()
        engine.dispose()
