"""Alembic environment for autoopt's own tables.

autoopt runs this programmatically (autoopt.store.db.migrate) and hands over an open connection in a
write transaction through `config.attributes["connection"]`. Run from the alembic command line (for
writing revisions), it opens $AUTOOPT_DB or db/autoopt.sqlite itself.

Only `autoopt_*` tables are ours: `include_name` keeps autogenerate away from Optuna's tables, and
the version table is `autoopt_alembic_version` (Optuna's is `alembic_version`).
"""
from __future__ import annotations

from typing import Any

from alembic import context

from autoopt.store.db import VERSION_TABLE, make_engine, resolve_url
from autoopt.store.models import Base

config = context.config
target_metadata = Base.metadata


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    if type_ == "table":
        return bool(name) and name.startswith("autoopt_") and name != VERSION_TABLE
    return True


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        render_as_batch=True,  # SQLite cannot ALTER most things: batch mode recreates the table
        include_name=include_name,
        compare_type=True,
        **kwargs,
    )


def run_migrations_offline() -> None:
    url, _ = resolve_url(config.get_main_option("sqlalchemy.url"))
    _configure(url=url, literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url, _ = resolve_url(config.get_main_option("sqlalchemy.url"))
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            _configure(connection=conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
