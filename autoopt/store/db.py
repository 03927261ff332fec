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
import os
import time
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection, Engine, URL, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, NoSuchModuleError, OperationalError

from autoopt.errors import StoreError

try:  # POSIX only; without it concurrent first-time creation of a SQLite file is not serialised
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

ENV_VAR = "AUTOOPT_DB"
DEFAULT_RELATIVE_PATH = Path("db") / "autoopt.sqlite"
VERSION_TABLE = "autoopt_alembic_version"
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
DEFAULT_BUSY_TIMEOUT_S = 60.0
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
    is_default = False
    if not url:
        url = os.environ.get(ENV_VAR) or None
    if not url:
        url = f"sqlite:///{(base / DEFAULT_RELATIVE_PATH).resolve()}"
        is_default = True
    elif "://" not in url:
        url = f"sqlite:///{(base / Path(url).expanduser()).resolve()}"
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
        mode = cur.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() != "wal":
            cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
    finally:
        cur.close()


def make_engine(url: str, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> Engine:
    """autoopt's own engine. SQLite: WAL, busy timeout, explicit BEGIN / BEGIN IMMEDIATE."""
    shown = display_url(url)
    backend = make_url(url).get_backend_name()
    kwargs: dict[str, Any] = {"future": True}
    if backend == "sqlite":
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
            _sqlite_pragmas(dbapi_conn, busy_timeout_s)

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            mode = conn.get_execution_options().get("autoopt_begin", "DEFERRED")
            conn.exec_driver_sql(f"BEGIN {mode}")
    return engine


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
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o664)
    except OSError as exc:
        raise StoreError(f"database {display_url(url)}: cannot create lock file {lock_path}: "
                         f"{exc.strerror}") from None
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StoreError(f"database {display_url(url)}: another process holds {lock_path} "
                                     f"for more than {timeout_s:.0f} s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _pg_setup_lock(url: str, timeout_s: float) -> Iterator[None]:
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 10})
    try:
        with engine.connect() as conn:
            deadline = time.monotonic() + timeout_s
            while not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _PG_SETUP_LOCK_KEY}).scalar():
                conn.rollback()
                if time.monotonic() > deadline:
                    raise StoreError(f"database {display_url(url)}: another process has been setting it "
                                     f"up for more than {timeout_s:.0f} s")
                time.sleep(0.05)
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_SETUP_LOCK_KEY})
                conn.commit()
    except DatabaseError as exc:
        raise StoreError(f"database {display_url(url)} cannot be set up: {_first_line(exc)}") from None
    finally:
        engine.dispose()


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
    from alembic.runtime.migration import MigrationContext

    ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
    return ctx.get_current_revision()


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "autoopt/store/migrations has no revisions"
    return head


def _known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def needs_migration(engine: Engine, url: str) -> bool:
    """Whether the schema is behind head (a plain read: no lock, no write). StoreError when the
    database carries a revision newer than this autoopt knows."""
    try:
        with engine.connect() as conn:
            rev = current_revision(conn)
    except DatabaseError as exc:
        raise StoreError(f"database {display_url(url)} cannot be read: {_first_line(exc)}") from None
    _refuse_unknown(rev, url)
    return rev != head_revision()


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
    orig = getattr(exc, "orig", None) or exc
    return str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__


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
