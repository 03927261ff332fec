"""The trial store against real SQLite files: opening, recording, reading back, Optuna's side,
interrupted trials, and two processes writing one file at once."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from store_helpers import STUDY, build_case_study, measurement, result_at_16

from autoopt.errors import StoreError, UserError
from autoopt.store import Store
from autoopt.trial import CostEstimate, Decision, Diagnosis, TrialResult


@pytest.fixture
def store(tmp_path):
    s = Store.open(str(tmp_path / "t.sqlite"))
    yield s
    s.close()


def _sql(path: Path, query: str) -> list[tuple]:
    con = sqlite3.connect(path)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


# ---- opening ----------------------------------------------------------------------------------------
def test_open_default_creates_db_dir_under_cwd_in_wal_mode(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTOOPT_DB", raising=False)
    with Store.open(None) as s:
        assert s.url == f"sqlite:///{tmp_path / 'db' / 'autoopt.sqlite'}"
    path = tmp_path / "db" / "autoopt.sqlite"
    assert path.is_file()
    assert _sql(path, "PRAGMA journal_mode") == [("wal",)]
    assert _sql(path, "SELECT version_num FROM autoopt_alembic_version") == [("0001",)]


def test_open_uses_env_var_and_bare_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOOPT_DB", f"sqlite:///{tmp_path / 'env.sqlite'}")
    with Store.open(None) as s:
        assert s.url.endswith("/env.sqlite")
    with Store.open("rel/../bare.sqlite") as s:  # a path, relative to the CWD
        assert s.url == f"sqlite:///{tmp_path / 'bare.sqlite'}"
    assert (tmp_path / "env.sqlite").is_file() and (tmp_path / "bare.sqlite").is_file()


@pytest.mark.parametrize("url, expected", [
    ("not a url://", "not valid"),
    ("nosuchdialect://host/db", "no driver"),
    ("sqlite://", "in-memory"),
])
def test_open_bad_urls_are_one_line_store_errors(url, expected):
    with pytest.raises(StoreError) as exc:
        Store.open(url)
    assert expected in str(exc.value) and "\n" not in str(exc.value)


def test_open_missing_file_without_create_names_the_file_and_creates_nothing(tmp_path):
    path = tmp_path / "missing.sqlite"
    with pytest.raises(StoreError, match="no database at .*missing.sqlite"):
        Store.open(str(path), create=False)
    assert not path.exists()


def test_open_missing_directory_and_non_database_file(tmp_path):
    with pytest.raises(StoreError, match="directory .*nodir does not exist"):
        Store.open(str(tmp_path / "nodir" / "x.sqlite"))
    junk = tmp_path / "junk.sqlite"
    junk.write_text("this is not a database " * 100)
    with pytest.raises(StoreError, match="junk.sqlite"):
        Store.open(str(junk))


# ---- recording and reading back ---------------------------------------------------------------------
def test_roundtrip_of_every_figure(store, tmp_path):
    run_id = build_case_study(store)
    trials = store.trials(STUDY)
    assert [t.number for t in trials] == [0, 1, 2, 3, 4]
    assert [t.state for t in trials] == ["ok", "ok", "ok", "failed", "wrong"]
    t1 = trials[1]
    expected = measurement(t1.params, {1: 33.4, 16: 63.07, 64: 63.07}, spread=0.03,
                           buckets=t1.measurement.buckets_ms)
    assert t1.measurement == expected  # every sample, CI, bucket, cost, what_ran, environment
    assert len(t1.measurement.tok_per_s["16"].samples_step_s) == 16
    assert t1.objective == pytest.approx(63.07, rel=1e-6)
    assert t1.objective_name == "tok_per_s@16"
    lo, hi = t1.objective_ci
    assert lo < t1.objective < hi
    assert t1.decision.source == "profile:gemm_simt" and t1.decision.expected_gain == 0.15
    assert t1.result.diagnosis.actual_gain == 0.018
    assert t1.diagnoses[0]["verdict"].startswith("GEMM -505 ms") and t1.diagnoses[0]["against_number"] == 0
    assert t1.run_id == run_id and t1.finished_at >= t1.started_at
    oom = trials[3]
    assert oom.objective is None and oom.failure.kind == "oom" and "OutOfMemoryError" in oom.failure.stderr_tail
    wrong = trials[4]
    assert wrong.objective is None and wrong.measurement.correctness["verdict"] == "wrong"
    # normalised where a person queries it; one environment row for five trials
    db = tmp_path / "t.sqlite"
    assert _sql(db, "SELECT count(*) FROM autoopt_samples") == [(16 * 3 * 3 + 16,)]
    assert _sql(db, "SELECT count(*) FROM autoopt_environments") == [(1,)]
    assert _sql(db, "SELECT ms FROM autoopt_buckets b JOIN autoopt_trials t USING (trial_id) "
                    "WHERE t.number = 1 AND bucket = 'copy_cast'") == [(500.0,)]
    assert _sql(db, "SELECT phase, seconds FROM autoopt_costs WHERE trial_id = "
                    f"{t1.trial_id} ORDER BY position")[0] == ("restart", 95.0)
    (run,) = store.runs(STUDY)
    assert (run.state, run.stop_reason, run.settings["objective"]) == ("finished", "budget spent", "tok_per_s@16")


def test_optuna_sees_params_values_and_states(store):
    build_case_study(store)
    study = store.optuna_study(STUDY)
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "COMPLETE", "COMPLETE", "FAIL", "FAIL"]
    assert study.trials[2].params == {"mhc_gemm": "bf16", "mhc_operand": "view_bf16_residual"}
    assert study.best_trial.number == 2
    assert study.trials[3].user_attrs["autoopt:failure"].startswith("oom:")
    assert [t.trial_id for t in store.trials(STUDY)] == [t._trial_id for t in study.trials]


def test_baseline_lookup_and_trial_lookup(store):
    build_case_study(store)
    assert store.baseline(STUDY).number == 0
    assert store.trial(STUDY, "2").number == 2 and store.trial(STUDY, "#2").number == 2
    t = store.trial(STUDY, 2)
    assert store.trial(STUDY, f"id:{t.trial_id}").number == 2
    with pytest.raises(UserError, match="has no trial 99 .*trials 0-4"):
        store.trial(STUDY, 99)
    with pytest.raises(UserError, match="not a trial number"):
        store.trial(STUDY, "best")
    assert store.studies() == [STUDY] and store.latest_study() == STUDY
    with pytest.raises(UserError, match="no study 'nope'"):
        store.resolve_study("nope")


def test_the_result_is_stored_as_given_not_recomputed(store):
    """The run's settings say tok_per_s@16 and the measurement has a CI at C=16; the loop's result
    says otherwise (a made-up name and CI): the store must write the result it was handed."""
    run_id = store.start_run("s", "cmd", None, None, None, None, None, {"objective": "tok_per_s@16"})
    m = measurement({"a": 1}, {1: 30.0, 16: 60.0})
    given = TrialResult("ok", 59.5, objective_ci=(50.0, 70.0), objective_name="tok_per_s@1",
                        objective_text="as the loop put it", cost_s=12.5, transition_s=2.5,
                        restart_class="recompile", speedup=1.25)
    h = store.begin_trial(run_id, "s", {"a": 1}, {"a": 1}, None)
    back = store.finish_trial(h, m, given)
    assert back.result == given
    assert (back.objective, back.objective_ci, back.objective_name) == (59.5, (50.0, 70.0), "tok_per_s@1")
    assert back.measurement.tok_per_s["16"].median != 59.5  # not the measurement's figure
    assert store.optuna_study("s").trials[0].value == 59.5  # Optuna was told the same


def test_a_decision_makes_the_round_trip_through_the_store_typed(store):
    run_id = store.start_run("s", "cmd", None, None, None, None, None, {})
    d = Decision({"a": 2}, "profile:gemm_simt", "GEMM is 19% of the step", expected_gain=0.08,
                 expected_gain_sd=0.03, parent=0, profile=True, confirms=None, rerun_of=4,
                 expected_cost=CostEstimate(30.0, 60.0, "recompile", ("a",), cached=False, known_s=25.0),
                 notes={"worth": 0.01, "p_fail": 0.2, "batch": 2})
    h = store.begin_trial(run_id, "s", d.params, d.params, d)
    assert store.trial("s", h.number).decision == d  # while running
    diag = Diagnosis("measured +1.0% vs #0", against=0, predicted_gain=0.08, actual_gain=0.01,
                     detail={"buckets_line": "GEMM -5 ms"})
    m = measurement({"a": 2}, {16: 61.0})
    back = store.finish_trial(h, m, result_at_16(m, diagnosis=diag))
    assert back.decision == d and back.decision.kind.value == "profile"
    assert back.result.diagnosis == diag and back.diagnoses[0]["against_number"] == 0
    assert back.decision.expected_cost_s == 90.0


def test_rows_written_before_the_typed_records_read_back(store):
    """decision_extra/extra as the loop wrote them before autoopt.trial: flat keys."""
    old = Decision.from_json({"a": 1}, "repeat", "r", None, None, 70.0,
                             {"parent": 3, "repeat_of": "challenger", "transition_expected_s": 10.0,
                              "cached": True, "profile": True})
    assert (old.parent, old.profile, old.notes["repeat_of"]) == (3, True, "challenger")
    assert old.expected_cost is None and old.notes["expected_cost_s"] == 70.0  # no split is made up
    res = TrialResult.from_json("ok", 60.0, None, None,
                                {"cost_s": 9.0, "transition_s": 1.0, "objective_ci": [59.0, 61.0],
                                 "objective_name": "tok_per_s@16", "incumbent_number": 2,
                                 "diagnosis": "slower", "actual_gain": -0.1})
    assert res.objective_ci == (59.0, 61.0) and res.objective_name == "tok_per_s@16"
    assert (res.diagnosis.verdict, res.diagnosis.against, res.diagnosis.actual_gain) == ("slower", 2, -0.1)


def test_failed_baseline_means_no_baseline(store):
    run_id = store.start_run("s", "cmd", None, None, None, None, None, {})
    from autoopt.measurement import Measurement
    from autoopt.trial import Decision
    h = store.begin_trial(run_id, "s", {"a": 1}, {"a": 1}, Decision({"a": 1}, "baseline", "start"))
    store.finish_trial(h, Measurement.failed({"a": 1}, "crash", "segfault"), TrialResult("failed", None))
    assert store.baseline("s") is None
    assert store.trials("s", states=["failed"])[0].is_baseline


def test_unstorable_values_and_wrong_direction_are_store_errors(store):
    run_id = store.start_run("s", "cmd", None, None, None, None, None, {})
    with pytest.raises(StoreError, match=r"params.k = .*object"):
        store.begin_trial(run_id, "s", {"k": object()}, {}, None)
    with pytest.raises(StoreError, match="created to maximize"):
        Store.open(store.url).optuna_study("s", direction="minimize")
    with pytest.raises(UserError, match="objective 'tok/s' not understood"):
        store.start_run("s", "cmd", None, None, None, None, None, {"objective": "tok/s"})


# ---- interrupted trials -----------------------------------------------------------------------------
_KILLED = textwrap.dedent("""
    import os, sys
    from autoopt.store import Store
    s = Store.open(sys.argv[1])
    run_id = s.start_run("st", "autoopt run", None, None, None, None, None, {})
    s.begin_trial(run_id, "st", {"mhc_gemm": "bf16"}, {"mhc_gemm": "bf16"}, None)
    os._exit(9)   # killed mid-trial: no finish_trial, no finish_run
""")


def test_mark_interrupted_recovers_trials_of_dead_processes_only(store):
    proc = subprocess.run([sys.executable, "-c", _KILLED, store.url], capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr
    run_id = store.start_run("st", "autoopt run --resume", None, None, None, None, None, {})
    mine = store.begin_trial(run_id, "st", {"mhc_gemm": "fp32"}, {}, None)  # alive: left alone
    orphan = store.optuna_study("st").ask()  # an Optuna trial that never got an autoopt row
    got = store.mark_interrupted("st")
    assert [t.number for t in got] == [0, orphan.number]
    assert got[0].state == "interrupted" and got[0].params == {"mhc_gemm": "bf16"}
    assert "ended before the trial finished" in got[0].failure.reason
    states = {t.number: t.state.name for t in store.optuna_study("st").trials}
    assert states == {0: "FAIL", mine.number: "RUNNING", orphan.number: "FAIL"}
    assert store.trial("st", mine.number).state == "running"
    assert [r.state for r in store.runs("st")] == ["interrupted", "running"]
    assert store.mark_interrupted("st") == []  # idempotent


def test_mark_interrupted_reconciles_a_trial_stored_but_not_told(store, tmp_path):
    run_id = store.start_run("st", "cmd", None, None, None, None, None, {"objective": "tok_per_s@16"})
    h = store.begin_trial(run_id, "st", {"x": 1}, {"x": 1}, None)
    # the process died after writing autoopt's rows but before telling Optuna
    from autoopt.store import optuna_bridge
    real_tell = optuna_bridge.tell
    optuna_bridge.tell = lambda *a, **k: True
    try:
        store.finish_trial(h, measurement({"x": 1}, {16: 60.0}), result_at_16(measurement({"x": 1}, {16: 60.0})))
    finally:
        optuna_bridge.tell = real_tell
    assert store.optuna_study("st").trials[0].state.name == "RUNNING"
    other = Store.open(store.url)  # a later process (same pid here, but not the run's Store)
    assert other.mark_interrupted("st") == []
    t = other.optuna_study("st").trials[0]
    assert (t.state.name, t.value) == ("COMPLETE", 60.0)
    other.close()


# ---- two processes, one SQLite file -----------------------------------------------------------------
_WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[4])
    from store_helpers import measurement, result_at_16
    from autoopt.store import Store
    from autoopt.trial import Decision
    url, worker, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    s = Store.open(url)
    run_id = s.start_run("shared", f"worker {worker}", None, None, None, None, None,
                         {"objective": "tok_per_s@16"})
    for i in range(n):
        p = {"worker": worker, "i": i}
        h = s.begin_trial(run_id, "shared", p, p, Decision(p, "sampler:random", "load test"))
        m = measurement(p, {1: 30.0 + i, 16: 60.0 + i})
        s.finish_trial(h, m, result_at_16(m))
    s.finish_run(run_id, "finished", "done")
    s.close()
""")


@pytest.mark.slow
def test_two_processes_write_one_sqlite_file_concurrently(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"  # fresh: both also race to create the schema
    n = 15
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, url, w, str(n), str(Path(__file__).parent)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for w in ("a", "b")]
    results = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
        assert "database is locked" not in err
    with Store.open(url, create=False) as s:
        trials = s.trials("shared")
        assert sorted(t.number for t in trials) == list(range(2 * n))
        assert {t.state for t in trials} == {"ok"}
        assert sorted(t.params["worker"] for t in trials) == ["a"] * n + ["b"] * n
        assert all(len(t.measurement.tok_per_s["16"].samples_step_s) == 16 for t in trials)
        assert [r.state for r in s.runs("shared")] == ["finished", "finished"]
        assert [t.state.name for t in s.optuna_study("shared").trials] == ["COMPLETE"] * (2 * n)
