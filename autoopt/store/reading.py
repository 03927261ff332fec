"""How a reading command (history, show, diff, report, browse) opens the study database.

open_for_reading gives a SQLite file at this autoopt's schema revision to SqliteReader, which reads
it through the standard library's sqlite3 alone (no SQLAlchemy, no Optuna: autoopt.store.sqlite_files
says why); anything else goes to Store.open(url, create=False), which reads it or says why not.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Callable

from autoopt.errors import StoreError
from autoopt.store.driver_errors import explain
from autoopt.store.queries import Sqlite3Reads, StoreQueries
from autoopt.store.sqlite_files import (DEFAULT_BUSY_TIMEOUT_S, HEAD_REVISION, VERSION_TABLE, connect_read_only,
                                        plain_sqlite_file, spelled_url)


class SqliteReader(StoreQueries):
    """A SQLite study read through sqlite3 alone (read-only; no SQLAlchemy, no Optuna)."""

    def __init__(self, path: Path, busy_timeout_s: float) -> None:
        self.url = f"sqlite:///{path}"
        self._conn = connect_read_only(path, busy_timeout_s)
        self._conn.isolation_level = None  # each read is one explicit BEGIN ... COMMIT

    def _read(self, what: str, fn: Callable[[Any], Any]) -> Any:
        try:
            self._conn.execute("BEGIN")
            try:
                return fn(Sqlite3Reads(self._conn))
            finally:
                self._conn.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot read {what} from {self.url}: {explain(exc)}") from None

    def shown_url(self) -> str:
        return self.url

    def schema_revision(self) -> str | None:
        return self._read("the schema revision", lambda conn: conn.rows(
            f"SELECT version_num FROM {VERSION_TABLE}"))[0].version_num

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "SqliteReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_for_reading(url: str | None, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> Any:
    """The study database for a reading command (a context manager with StoreQueries' methods): a
    SQLite file at this autoopt's schema revision through SqliteReader; anything else (PostgreSQL, a
    URL with options, a missing, damaged or older file) through Store.open(url, create=False), which
    reads it or says in one line why it cannot."""
    path = plain_sqlite_file(spelled_url(url, Path.cwd())[0], Path.cwd())
    if path is not None and path.is_file():
        reader = None
        try:
            reader = SqliteReader(path, busy_timeout_s)
            if reader.schema_revision() == HEAD_REVISION:
                return reader
        except (sqlite3.Error, StoreError, IndexError):
            pass  # Store.open names what is wrong with the file
        if reader is not None:
            reader.close()
    from autoopt.store.store import Store

    return Store.open(url, create=False, busy_timeout_s=busy_timeout_s)
