"""Where the trial database is and how to talk to it: URL resolution, engines, SQLite WAL, migrations.

One database holds both Optuna's tables (through its RDBStorage) and autoopt's own `autoopt_*`
tables, migrated by alembic with their own version table `autoopt_alembic_version` (Optuna keeps
`alembic_version` for itself). Nothing here imports torch, triton or optuna.

SQLite and several writers: the file is switched to WAL (persistent in the file), every connection
waits up to `busy_timeout_s` for a lock, and autoopt's write transactions start with
`BEGIN IMMEDIATE` so a read-then-write never fails with SQLITE_BUSY_SNAPSHOT.
"""
from __future__ import annotations

import contextlib
import random
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection, Engine, URL, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, NoSuchModuleError, OperationalError

from autoopt.errors import StoreError
from autoopt.store.driver_errors import explain
from autoopt.store.sqlite_files import (  # noqa: F401  (ENV_VAR, VERSION_TABLE, HEAD_REVISION: re-exported)
    DEFAULT_BUSY_TIMEOUT_S, ENV_VAR, HEAD_REVISION, VERSION_TABLE, connect_read_only, spelled_url)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
_PG_MIGRATION_LOCK_KEY = 0x6175746F6F7074  # "autoopt": pg_advisory_xact_lock key for migrations
# first-time setup (migrations AND Optuna's table creation), held on a connection of its own; a key
# apart from the migrations' so the migration inside it does not wait on its own process
_PG_SETUP_LOCK_KEY = 0x6175746F6F7075


def display_url(url: str | URL) -> str:
    """The URL as it may be printed: password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return str(url)


def resolve_url(url: str | None, *, cwd: Path | None = None) -> tuple[str, bool]:
    """-> (SQLAlchemy URL, is_default). None -> $AUTOOPT_DB -> sqlite:///<cwd>/db/autoopt.sqlite.

    A bare path (no "://") is taken as a SQLite file. Relative SQLite paths are made absolute so the
    URL means the same file from any working directory (worker subprocesses, optuna-dashboard).
    """
    base = cwd or Path.cwd()
    url, is_default = spelled_url(url, base)
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(f"database URL {url!r} is not valid: expected e.g. sqlite:///db/autoopt.sqlite "
                         f"or postgresql://user@host/dbname") from None
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database or ""
        if db in ("", ":memory:") or db.startswith("file:"):
            raise StoreError(f"database URL {url!r}: an in-memory SQLite database cannot be shared "
                             f"with Optuna or other processes; give a file path")
        path = Path(db).expanduser()
        if not path.is_absolute():
            path = (base / path).resolve()
        url = parsed.set(database=str(path)).render_as_string(hide_password=False)
    return url, is_default


def sqlite_path(url: str) -> Path | None:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    return Path(parsed.database or "")


def _sqlite_pragmas(dbapi_conn: Any, busy_timeout_s: float) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        _switch_to_wal(cur, busy_timeout_s)
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
    finally:
        cur.close()


def _switch_to_wal(cur: Any, timeout_s: float) -> None:
    """WAL, retried until `timeout_s`: switching needs the exclusive lock, and while another connection
    holds the write lock of a database still in rollback mode (two runs creating a fresh file at
    once), SQLite answers at once with "database is locked" instead of calling the busy handler."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02 + 0.05 * random.random())  # apart from the other process's retries


def make_engine(url: str, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
                read_only: bool = False) -> Engine:
    """autoopt's own engine. SQLite: WAL, busy timeout, explicit BEGIN / BEGIN IMMEDIATE.
    read_only: SQLite opened with mode=ro (never writes, never switches the journal), and immutable
    where WAL's side files can neither be found nor created (a read-only directory or file system)."""
    shown = display_url(url)
    backend = make_url(url).get_backend_name()
    kwargs: dict[str, Any] = {"future": True}
    if backend == "sqlite" and read_only:
        kwargs["creator"] = _read_only_connector(sqlite_path(url), busy_timeout_s)
        url = "sqlite://"
    elif backend == "sqlite":
        kwargs["connect_args"] = {"timeout": busy_timeout_s}
    else:
        kwargs["pool_pre_ping"] = True
        if backend == "postgresql":
            kwargs["connect_args"] = {"connect_timeout": 10}
    try:
        engine = create_engine(url, **kwargs)
    except (NoSuchModuleError, ImportError) as exc:
        raise StoreError(f"database {shown}: no driver for this URL scheme ({exc}); install it "
                         f"(e.g. `pip install 'psycopg[binary]'` for postgresql://)") from None
    except ArgumentError as exc:
        raise StoreError(f"database URL {shown} is not valid: {exc}") from None

    if backend == "sqlite":
        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (see _on_begin)
            if not read_only:
                _sqlite_pragmas(dbapi_conn, busy_timeout_s)

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            mode = conn.get_execution_options().get("autoopt_begin", "DEFERRED")
            conn.exec_driver_sql(f"BEGIN {mode}")
    return engine


def _read_only_connector(path: Path | None, busy_timeout_s: float) -> Any:
    return lambda: connect_read_only(Path(path or ""), busy_timeout_s)


@contextlib.contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that takes the write lock first (SQLite BEGIN IMMEDIATE, waits busy_timeout)."""
    with engine.connect() as conn:
        conn = conn.execution_options(autoopt_begin="IMMEDIATE")
        with conn.begin():
            yield conn


@contextlib.contextmanager
def guarded_write(engine: Engine, url: str, what: str) -> Iterator[Connection]:
    """write_transaction whose database errors become one-line StoreErrors naming `what` and the URL."""
    try:
        with write_transaction(engine) as conn:
            yield conn
    except DatabaseError as exc:
        raise StoreError(f"cannot {what} in {display_url(url)}: {_first_line(exc)}") from None


def check_reachable(url: str, *, create: bool, is_default: bool) -> None:
    """Fail early, with the file or URL named, before any engine is built."""
    path = sqlite_path(url)
    if path is None:
        return
    if path.is_dir():
        raise StoreError(f"database {path} is a directory: expected a SQLite file")
    if not path.exists():
        if not create:
            raise StoreError(f"no database at {path}: run `autoopt run` first, or pass --db / set "
                             f"${ENV_VAR} to an existing database")
        if is_default:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif not path.parent.is_dir():
            raise StoreError(f"database {path}: directory {path.parent} does not exist")


def alembic_config(connection: Connection | None = None) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("version_table", VERSION_TABLE)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def current_revision(conn: Connection) -> str | None:
    """The revision in autoopt's version row (None: no autoopt tables yet), read with plain SQL."""
    from sqlalchemy import inspect

    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def head_revision() -> str:
    """alembic's head of autoopt/store/migrations (imports alembic: for migrating and the tests)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "autoopt/store/migrations has no revisions"
    return head


def _known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def _read_revision(engine: Engine, url: str) -> str | None:
    try:
        with engine.connect() as conn:
            return current_revision(conn)
    except DatabaseError as exc:
        raise StoreError(f"database {display_url(url)} cannot be read: {_first_line(exc)}") from None


def needs_migration(engine: Engine, url: str) -> bool:
    """Whether the schema is behind head (a plain read: no lock, no write). StoreError when the
    database carries a revision newer than this autoopt knows."""
    rev = _read_revision(engine, url)
    if rev == HEAD_REVISION:
        return False
    _refuse_unknown(rev, url)
    return True


def check_readable(engine: Engine, url: str) -> None:
    """The read path's schema check: the version row against HEAD_REVISION, no alembic, no writes.
    StoreError when the file holds no autoopt tables or a schema this autoopt cannot read."""
    rev = _read_revision(engine, url)
    if rev == HEAD_REVISION:
        return
    if rev is None:
        raise StoreError(f"database {display_url(url)} holds no autoopt tables: run `autoopt run` on it "
                         "first, or pass --db / set $AUTOOPT_DB to an autoopt database")
    _refuse_unknown(rev, url)
    raise StoreError(f"database {display_url(url)} has autoopt schema revision {rev!r}, older than this "
                     f"autoopt's {HEAD_REVISION!r}: a reading command does not migrate; run `autoopt run` "
                     "on it once (that upgrades it)")


def _refuse_unknown(rev: str | None, url: str) -> None:
    if rev is not None and rev not in _known_revisions():
        raise StoreError(
            f"database {display_url(url)} has autoopt schema revision {rev!r}, newer than this autoopt "
            f"knows (head {head_revision()!r}): upgrade autoopt to use it")


def migrate(engine: Engine, url: str, *, target: str = "head", down: bool = False) -> str:
    """Create or upgrade autoopt's tables to `target`; refuse a database from a newer autoopt.

    Runs in one write transaction (SQLite: BEGIN IMMEDIATE; PostgreSQL: advisory lock), so two
    processes opening a fresh database at once neither race nor fail. Returns the revision now there.
    down=True downgrades to `target` instead (developers and tests; e.g. target="base").
    """
    from alembic import command

    shown = display_url(url)
    try:
        with write_transaction(engine) as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK_KEY})
            rev = current_revision(conn)
            _refuse_unknown(rev, url)
            if down:
                command.downgrade(alembic_config(conn), target)
            elif rev != head_revision() or target != "head":
                command.upgrade(alembic_config(conn), target)
            return current_revision(conn) or ""
    except DatabaseError as exc:
        raise StoreError(f"database {shown} cannot be opened or migrated: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return explain(exc)


def first_line(exc: BaseException) -> str:
    """The driver's message of a database error, one line (for StoreError texts)."""
    return _first_line(exc)


def ping(engine: Engine, url: str) -> None:
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        raise StoreError(f"database {display_url(url)} is unreachable: {_first_line(exc)}") from None
    except DatabaseError as exc:
        raise StoreError(f"database {display_url(url)} is not usable: {_first_line(exc)}") from None
