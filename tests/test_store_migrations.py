"""autoopt's alembic migrations: own version table, schema == models, Optuna's tables untouched,
a newer schema refused, downgrade/upgrade round trip, optuna still opens the study."""
from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import create_engine
from store_helpers import STUDY, build_case_study

from autoopt.errors import StoreError
from autoopt.store import Store, db
from autoopt.store.models import AUTOOPT_TABLES, Base


def _tables(path: Path) -> dict[str, str]:
    con = sqlite3.connect(path)
    try:
        return dict(con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall())
    finally:
        con.close()


def _version(path: Path, table: str) -> list[tuple]:
    con = sqlite3.connect(path)
    try:
        return con.execute(f"SELECT version_num FROM {table}").fetchall()
    finally:
        con.close()


def test_fresh_database_has_our_tables_and_our_own_version_table(tmp_path):
    path = tmp_path / "m.sqlite"
    with Store.open(str(path)) as s:
        s.optuna_study("x")  # brings Optuna's tables (and its alembic_version) in
    tables = _tables(path)
    assert set(AUTOOPT_TABLES) <= set(tables)
    assert all(t.startswith("autoopt_") for t in AUTOOPT_TABLES)
    assert {"studies", "trials", "trial_params", "alembic_version"} <= set(tables)
    assert _version(path, "autoopt_alembic_version") == [(db.head_revision(),)]
    assert _version(path, "alembic_version") != _version(path, "autoopt_alembic_version")


def test_migrated_schema_matches_the_models(tmp_path):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    path = tmp_path / "m.sqlite"
    Store.open(str(path)).close()
    engine = create_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={
            "compare_type": True, "version_table": db.VERSION_TABLE,
            "include_name": lambda name, type_, parent: type_ != "table" or name in AUTOOPT_TABLES})
        diffs = compare_metadata(ctx, Base.metadata)
    engine.dispose()
    assert diffs == []


def test_optuna_tables_are_left_exactly_as_optuna_made_them(tmp_path):
    import optuna

    path = tmp_path / "o.sqlite"
    url = f"sqlite:///{path}"
    optuna.create_study(storage=url, study_name="made-by-optuna")  # Optuna first, autoopt later
    before = _tables(path)
    optuna_version = _version(path, "alembic_version")
    with Store.open(url) as s:
        build_case_study(s)
    after = _tables(path)
    assert {k: v for k, v in after.items() if k in before} == before
    assert _version(path, "alembic_version") == optuna_version
    assert set(after) - set(before) == set(AUTOOPT_TABLES) | {db.VERSION_TABLE}


def test_a_newer_schema_is_refused_with_a_clear_error(tmp_path):
    path = tmp_path / "n.sqlite"
    Store.open(str(path)).close()
    con = sqlite3.connect(path)
    con.execute("UPDATE autoopt_alembic_version SET version_num = '0099'")
    con.commit()
    con.close()
    with pytest.raises(StoreError) as exc:
        Store.open(str(path))
    msg = str(exc.value)
    assert "'0099'" in msg and "newer than this autoopt" in msg and str(path) in msg


def test_downgrade_to_base_and_upgrade_on_open(tmp_path):
    path = tmp_path / "d.sqlite"
    url = f"sqlite:///{path}"
    with Store.open(url) as s:
        db.migrate(s.engine, url, target="base", down=True)
    assert not set(AUTOOPT_TABLES) & set(_tables(path))
    with Store.open(url) as s:  # migrations run on open
        build_case_study(s)
        assert len(s.trials(STUDY)) == 5
    assert _version(path, "autoopt_alembic_version") == [(db.head_revision(),)]


def test_reopening_is_idempotent_and_keeps_data(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    with Store.open(url) as s:
        build_case_study(s)
    for _ in range(2):
        with Store.open(url) as s:
            assert len(s.trials(STUDY)) == 5


_LOAD = textwrap.dedent("""
    import sys, optuna
    study = optuna.load_study(study_name=sys.argv[2], storage=sys.argv[1])
    print(len(study.trials), study.best_trial.number, sorted(study.best_trial.params.items()))
""")


def test_plain_optuna_opens_the_study_as_optuna_dashboard_would(tmp_path):
    url = f"sqlite:///{tmp_path / 'dash.sqlite'}"
    with Store.open(url) as s:
        build_case_study(s)
    out = subprocess.run([sys.executable, "-c", _LOAD, url, STUDY], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split(" ", 2)[:2] == ["5", "2"]
    assert "view_bf16_residual" in out.stdout
