"""The store on storage that misbehaves (issue 12 item 6): a database on read-only storage is readable
by every reading command (history, show, diff, best, report, browse); a full disk and a damaged page
give one clear line instead of Optuna's or SQLite's words; the read path imports no alembic and
runs no migration.

Read-only storage and a full disk are real: a read-only bind mount and a small tmpfs, each in a
mount namespace of its own (`unshare -m`, needs root or user namespaces)."""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import REPO, autoopt_cmd, env, run_autoopt

TABLE = REPO / "benchmarks" / "data" / "tiny_cpu_grid.csv"
STUDY = "replay_tiny_cpu_grid"


def _can_unshare_mounts() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


needs_mounts = pytest.mark.skipif(not _can_unshare_mounts(),
                                  reason="needs `unshare -m` with mount rights (root or user namespaces)")


@pytest.fixture(scope="module")
def study_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real study: a replay run of a few trials (seconds, no worker)."""
    db = tmp_path_factory.mktemp("study") / "db.sqlite"
    out = run_autoopt("run", "--plain", "--target", f"replay:{TABLE}", "--budget", "30m",
                      "--max-trials", "4", "--db", str(db), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return db


def _in_namespace(script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                          env=env(), cwd=REPO, timeout=timeout)


def _cmd(*args: str) -> str:
    return shlex.join(autoopt_cmd(*args))


_BROWSE = """
import asyncio, sys
from autoopt.cli.browse.app import BrowseApp
from autoopt.store import Store

async def main(store):
    app = BrowseApp(store, sys.argv[2], poll_s=60)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        print("rows", app.screen.query_one("#trials").row_count)

with Store.open(sys.argv[1], create=False) as store:
    asyncio.run(main(store))
"""


@needs_mounts
def test_every_reading_command_reads_a_database_on_read_only_storage(study_db: Path, tmp_path: Path):
    ro = tmp_path / "ro"
    ro.mkdir()
    shutil.copy(study_db, ro / "db.sqlite")  # closed cleanly: no -wal / -shm beside it
    assert not (ro / "db.sqlite-wal").exists()
    (tmp_path / "browse.py").write_text(_BROWSE)
    db, out = str(ro / "db.sqlite"), tmp_path / "report"
    reads = [_cmd("history", "--db", db), _cmd("show", "0", "--db", db), _cmd("diff", "0", "1", "--db", db),
             _cmd("best", "--json", "--db", db), _cmd("report", "--db", db, "--out", str(out)),
             f"'{sys.executable}' '{tmp_path / 'browse.py'}' '{db}' '{STUDY}'"]
    script = (f"mount --bind '{ro}' '{ro}' && mount -o remount,ro,bind '{ro}' && "
              f"( touch '{ro}/probe' 2>/dev/null && echo WRITABLE; true ) && "
              + " && ".join(f"{c} > /dev/null && echo 'ok {i}'" for i, c in enumerate(reads[:-1]))
              + f" && {reads[-1]}")
    done = _in_namespace(script)
    assert "WRITABLE" not in done.stdout  # the storage really is read-only
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert [f"ok {i}" in done.stdout for i in range(5)] == [True] * 5
    assert "rows 5" in done.stdout or "rows 4" in done.stdout, done.stdout
    assert sorted(p.name for p in ro.iterdir()) == ["db.sqlite"]  # nothing written beside it


def test_reading_imports_no_alembic_and_runs_no_migration(study_db: Path):
    code = ("import sys; from autoopt.store import Store\n"
            f"s = Store.open({str(study_db)!r}, create=False); s.trials({STUDY!r}); s.close()\n"
            "assert 'alembic' not in sys.modules, 'alembic imported on the read path'\n"
            "from autoopt.store import db; from alembic.script import ScriptDirectory\n"
            "assert db.HEAD_REVISION == db.head_revision(), (db.HEAD_REVISION, db.head_revision())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_reading_command_refuses_a_file_without_autoopt_tables(tmp_path: Path):
    import sqlite3

    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    out = run_autoopt("history", "--db", str(other))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "holds no autoopt tables" in out.stderr
    with sqlite3.connect(other) as conn:  # and it created none
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["t"]


def test_a_damaged_page_is_named_as_damage(study_db: Path, tmp_path: Path):
    bad = tmp_path / "bad.sqlite"
    data = bytearray(study_db.read_bytes())
    page = int.from_bytes(data[16:18], "big") or 65536
    for i in range(page, len(data)):  # every page but the first (the header and the schema root)
        data[i] = (i * 131 + 7) % 256
    bad.write_bytes(bytes(data))
    out = run_autoopt("history", "--db", str(bad))
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
    assert "damaged" in out.stderr and "Traceback" not in out.stderr


@needs_mounts
def test_a_full_disk_is_one_clear_line_and_what_was_recorded_stays_readable(study_db: Path, tmp_path: Path):
    small = tmp_path / "small"
    small.mkdir()
    size_k = os.path.getsize(study_db) // 1024 + 96  # the copy, its WAL, and a few trials' worth
    db = small / "db.sqlite"
    script = (f"mount -t tmpfs -o size={size_k}k tmpfs '{small}' && cp '{study_db}' '{db}' && "
              + _cmd("run", "--plain", "--target", f"replay:{TABLE}", "--budget", "100h", "--max-trials",
                     "400", "--strategy", "random", "--db", str(db))
              + f"; echo \"rc=$?\"; {_cmd('history', '--db', str(db))} > /dev/null; echo \"read=$?\"")
    done = _in_namespace(script, timeout=600)
    assert "rc=2" in done.stdout, (done.stdout[-1000:], done.stderr[-3000:])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "disk holding the database is full" in errors[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "An exception is raised during the commit" not in done.stderr
    assert "read=0" in done.stdout, done.stderr[-2000:]
