"""The reading commands' SQLite reader (autoopt.store.reading: sqlite3 alone) reads what the SQLAlchemy
store reads, on a copy of the committed H200 study; its column maps follow the models; what it cannot
read (a damaged file, another schema revision, a missing file) goes to Store.open and its one-line
error; and no reading command imports SQLAlchemy for a SQLite study."""
from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import JSON, Boolean, DateTime

from autoopt.errors import StoreError
from autoopt.store import Store
from autoopt.store.models import Base
from autoopt.store.queries import BOOL_COLUMNS, JSON_COLUMNS, TABLE_COLUMNS, TIME_COLUMNS
from autoopt.store.reading import SqliteReader, open_for_reading

ROOT = Path(__file__).resolve().parents[1]
STUDY_DB = ROOT / "benchmarks" / "results" / "h200_study.sqlite"
STUDY = "flash-h200"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "h200.sqlite"
    shutil.copy(STUDY_DB, path)  # never the committed file
    return path


def test_reader_reads_what_the_store_reads(db_path: Path) -> None:
    with open_for_reading(str(db_path)) as reader, Store.open(str(db_path), create=False) as store:
        assert isinstance(reader, SqliteReader) and reader.url == store.url
        for name, args in [("studies", ()), ("runs", (STUDY,)), ("study_summary", (STUDY,)),
                           ("baseline", (STUDY,)), ("trial", (STUDY, "id:19")), ("trial", (STUDY, 18)),
                           ("trials", (STUDY,)), ("trials", (STUDY, ("failed",)))]:
            assert getattr(reader, name)(*args) == getattr(store, name)(*args), name
        lean = reader.trials(STUDY, with_samples=False)
        assert lean == store.trials(STUDY, with_samples=False)
        assert len(lean) == 82 and lean[18].failure is not None and lean[0].is_baseline is True
        assert all(not tp.samples_step_s for t in lean if t.measurement for tp in t.measurement.tok_per_s.values())
        with pytest.raises(Exception, match="has no trial 999 \\(it has trials 0-81\\)"):
            reader.trial(STUDY, 999)


def test_column_maps_follow_the_models() -> None:
    """A column added to models.py without its place here would be silently dropped: this fails first."""
    for table, columns in TABLE_COLUMNS.items():
        model = Base.metadata.tables[table]
        assert columns == tuple(c.name for c in model.columns), table
        for c in model.columns:
            kind = (JSON_COLUMNS if isinstance(c.type, JSON) else TIME_COLUMNS if isinstance(c.type, DateTime)
                    else BOOL_COLUMNS if isinstance(c.type, Boolean) else None)
            if kind is not None:
                assert c.name in kind, (table, c.name)
            else:
                assert c.name not in JSON_COLUMNS | TIME_COLUMNS | BOOL_COLUMNS, (table, c.name)


def test_what_the_reader_cannot_read_goes_to_the_store(db_path: Path, tmp_path: Path) -> None:
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE autoopt_alembic_version SET version_num = '0000'")
    with pytest.raises(StoreError, match="has autoopt schema revision '0000'"):
        open_for_reading(str(db_path))
    damaged = tmp_path / "damaged.sqlite"
    damaged.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="not a SQLite database"):
        open_for_reading(str(damaged))
    with pytest.raises(StoreError, match="no database at"):
        open_for_reading(str(tmp_path / "missing.sqlite"))


def test_reading_commands_never_import_sqlalchemy(db_path: Path, tmp_path: Path) -> None:
    code = ("import sys\n"
            "from autoopt.cli import main\n"
            "sys.argv = ['autoopt'] + sys.argv[1:]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print('heavy:', sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'optuna', 'torch'}))\n")
    for args in (["history"], ["show", "59"], ["diff", "0", "59"], ["history", "--json"],
                 ["report", "--out", str(tmp_path / "r.html")]):
        out = subprocess.run([sys.executable, "-c", code, *args, "--db", str(db_path)], capture_output=True,
                             text=True, timeout=300, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
        assert out.returncode == 0, (args, out.stderr)
        assert out.stdout.strip().splitlines()[-1] == "heavy: []", args
