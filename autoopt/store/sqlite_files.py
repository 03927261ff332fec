"""Which database a URL names, and a SQLite file opened read-only, with the standard library alone.

The reading commands (history, show, diff, report, browse) read a SQLite study through sqlite3
without importing SQLAlchemy: that import alone costs about 0.35 s of CPU on the 2-core VM, a third
of what `autoopt browse` may spend before its first screen is painted (benchmarks/browse_startup.py).
autoopt.store.db builds on this module for everything else (engines, PostgreSQL, migrations).
"""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

ENV_VAR = "AUTOOPT_DB"
DEFAULT_RELATIVE_PATH = Path("db") / "autoopt.sqlite"
VERSION_TABLE = "autoopt_alembic_version"
DEFAULT_BUSY_TIMEOUT_S = 60.0  # how long a connection waits for another process's lock
# The newest migration's revision (autoopt/store/migrations/versions): compared with the database's
# version row on every open without importing alembic (0.2-0.5 s); alembic is imported only when a
# migration must run. tests/test_store_migrations.py checks it against alembic's head.
HEAD_REVISION = "0001"
_SQLITE_PREFIX = "sqlite:///"


def spelled_url(url: str | None, base: Path) -> tuple[str, bool]:
    """-> (URL, is_default): None -> $AUTOOPT_DB -> sqlite:///<base>/db/autoopt.sqlite; a bare path
    (no "://") is a SQLite file, made absolute against `base`. Any other URL is returned as given."""
    if not url:
        url = os.environ.get(ENV_VAR) or None
    if not url:
        return f"{_SQLITE_PREFIX}{(base / DEFAULT_RELATIVE_PATH).resolve()}", True
    if "://" not in url:
        return f"{_SQLITE_PREFIX}{(base / Path(url).expanduser()).resolve()}", False
    return url, False


def plain_sqlite_file(url: str, base: Path) -> Path | None:
    """The absolute file of a `sqlite:///PATH` URL that carries nothing else (no driver, no query,
    no escapes, not in memory); None for any other URL (autoopt.store.db parses those)."""
    if not url.startswith(_SQLITE_PREFIX) or any(ch in url for ch in "?%#"):
        return None
    database = url[len(_SQLITE_PREFIX):]
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    path = Path(database).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def connect_read_only(path: Path, busy_timeout_s: float) -> sqlite3.Connection:
    """`path` opened with mode=ro (never writes, never switches the journal), and immutable where
    WAL's side files can neither be found nor created (a read-only directory or file system)."""
    have_side_files = all(Path(f"{path}{ext}").exists() for ext in ("-wal", "-shm"))
    usable = have_side_files or os.access(path.parent, os.W_OK)  # W_OK fails on a read-only file system too
    flags = "mode=ro" if usable else "mode=ro&immutable=1"
    return sqlite3.connect(f"file:{quote(str(path))}?{flags}", uri=True, timeout=busy_timeout_s,
                           check_same_thread=False)
