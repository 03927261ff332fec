"""The store on a real PostgreSQL server (loopback, started by the test): `autoopt run` creates the
schema through alembic there, records every trial, resumes the study, and two runs writing the same
study at once number their trials without a gap or a clash; the reading commands read it back.

The runs drive the replay target (simulated clock: a 2-hour search in seconds), so what is tested is
the store, not the machine's speed. Skipped with the reason where PostgreSQL or psycopg is missing.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import run_autoopt, start_autoopt
from postgres_server import PostgresServer

pytestmark = pytest.mark.timeout(600)
CASE = Path(__file__).resolve().parent / "fixtures" / "replay" / "casestudy.csv"
TARGET = f"replay:{CASE}"


@pytest.fixture(scope="module")
def server():
    srv = PostgresServer()
    yield srv
    srv.stop()


def _store_trials(url: str, study: str) -> list:
    from autoopt.store import Store

    with Store.open(url, create=False) as store:
        return store.trials(study, with_samples=False)


def _store_runs(url: str, study: str) -> list:
    from autoopt.store import Store

    with Store.open(url, create=False) as store:
        return store.runs(study)


def test_run_resume_and_read_back_on_postgresql(server):
    url = server.new_database()
    first = run_autoopt("run", "--target", TARGET, "--db", url, "--study", "pg", "--budget", "2h",
                        "--max-trials", "6", "--seed", "1", "--plain")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    rows = _store_trials(url, "pg")
    assert [r.number for r in rows] == list(range(len(rows))) and len(rows) >= 6
    assert rows[0].is_baseline and rows[0].state == "ok"
    again = run_autoopt("run", "--target", TARGET, "--db", url, "--study", "pg", "--budget", "2h",
                        "--max-trials", "3", "--seed", "2", "--plain")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    more = _store_trials(url, "pg")
    assert [r.number for r in more] == list(range(len(more))) and len(more) > len(rows)
    assert len(_store_runs(url, "pg")) == 2

    hist = run_autoopt("history", "--db", url, "--study", "pg", "--json")
    assert hist.returncode == 0, hist.stderr
    assert [t["number"] for t in json.loads(hist.stdout)["trials"]] == [r.number for r in more]
    best = run_autoopt("best", "--db", url, "--study", "pg", "--json")
    assert best.returncode == 0, best.stderr
    number = json.loads(best.stdout)["trial"]["number"]
    show = run_autoopt("show", str(number), "--db", url, "--study", "pg", "--json")
    assert show.returncode == 0, show.stderr
    assert json.loads(show.stdout)["trial"]["number"] == number


def test_four_runs_at_once_on_a_fresh_postgresql_database(server, tmp_path):
    """All four start before any table exists, two on each of two studies: the setup lock lets one
    process create Optuna's tables and autoopt's, the environment row is inserted once, and each
    study's trials share one numbering. (Without the setup lock and the ON CONFLICT insert, about
    half of such processes failed on CREATE TYPE or on the environment's unique key.)"""
    url = server.new_database()
    logs = [tmp_path / f"run{i}.log" for i in range(4)]
    procs = [start_autoopt("run", "--target", TARGET, "--db", url, "--study", f"s{i % 2}", "--budget", "2h",
                           "--max-trials", "3", "--no-confirm", "--strategy", "random", "--seed", str(i),
                           "--plain", log=log) for i, log in enumerate(logs)]
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=300))
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = "\n---\n".join(log.read_text()[-2000:] for log in logs)
    assert codes == [0, 0, 0, 0], text
    for study in ("s0", "s1"):
        rows = _store_trials(url, study)
        assert sorted(r.number for r in rows) == list(range(6)), text
        assert len({r.run_id for r in rows}) == 2
        assert [r.state for r in _store_runs(url, study)] == ["finished", "finished"]


def test_unreachable_postgresql_is_one_clear_line(server):
    dead = server.url("no_such_database")
    out = run_autoopt("history", "--db", dead, "--study", "pg")
    assert out.returncode == 2
    assert out.stderr.startswith("error:") and "no_such_database" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
