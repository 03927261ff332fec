"""The browser keeps up while a real `autoopt run` subprocess appends trials to the same SQLite file:
the table grows while the run works, and ends with every trial the run wrote, read incrementally."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoopt.cli.browse.app import BrowseApp
from autoopt.store import Store
from autoopt.store.reading import SqliteReader, open_for_reading

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests" / "fixtures" / "replay" / "casestudy.csv"
STUDY = "browse-live"


def _start_run(url: str) -> subprocess.Popen:
    # random search with a huge simulated budget: ~60 trials over a few seconds of real time
    argv = [sys.executable, "-m", "autoopt.cli", "run", "--target", f"replay:{TABLE}", "--strategy", "random",
            "--max-trials", "60", "--budget", "1000h", "--study", STUDY, "--db", url, "--plain", "--no-confirm"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for_study(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"autoopt run ended early: {proc.stderr.read()}"
        with Store.open(url, create=False) as store:
            if STUDY in store.studies() and store.study_summary(STUDY)["counts"]:
                return
        time.sleep(0.05)
    pytest.fail("autoopt run wrote no trial within a minute")


@pytest.mark.slow
def test_table_grows_while_a_run_writes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'live.sqlite'}"
    with Store.open(url):  # created and migrated before either side opens it
        pass
    proc = _start_run(url)
    try:
        _wait_for_study(url, proc)
        seen_while_running: list[int] = []

        async def go() -> tuple[int, int, int]:
            with open_for_reading(url) as store:  # sqlite3 reading while SQLAlchemy writes (WAL)
                assert isinstance(store, SqliteReader)
                app = BrowseApp(store, STUDY, poll_s=0.1)
                async with app.run_test(size=(80, 24)) as pilot:
                    screen = app.screen
                    while proc.poll() is None:
                        await pilot.pause(0.1)
                        seen_while_running.append(screen.query_one("#trials").row_count)
                    await pilot.pause(0.5)  # one more poll after the last write
                    final = screen.query_one("#trials").row_count
                    with Store.open(url, create=False) as other:
                        in_db = sum(other.study_summary(STUDY)["counts"].values())
                    return final, in_db, screen.source.full_loads

        final, in_db, full_loads = asyncio.run(go())
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == 0, proc.stderr.read()
    assert len(set(seen_while_running)) >= 3, f"the table did not grow while the run wrote: {seen_while_running}"
    assert seen_while_running == sorted(seen_while_running)
    assert final == in_db >= 50
    # mostly incremental reads: a full reload only at open and when the baseline first appears
    assert full_loads <= 3, full_loads
