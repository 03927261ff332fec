"""`autoopt run --warm-start STUDY [--warm-start-db URL]`, end to end: real `autoopt run` processes on the
committed CPU replay table (benchmarks/data/tiny_cpu_grid.csv), one real SQLite file per test module.

A warm-started run's first proposals differ from a cold run's with the same seed (the replay target and
the agent are seeded, so a warm start that changed nothing would repeat the cold run's proposals), and
the run, its first decision and the decisions taken while the agent uses the other study say so. Bad
input is one line, exit 2, and starts nothing."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autoopt.store import Store

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "benchmarks" / "data" / "tiny_cpu_grid.csv"
TILES = REPO / "tests" / "fixtures" / "replay" / "tiles.csv"  # another space: no knob in common
SEED = "1"


def _run(db: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoopt.cli", "run", "--plain", "--db", str(db), *args],
                          capture_output=True, text=True, cwd=db.parent, timeout=240)


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _table_without(tmp: Path, knob: str) -> Path:
    """tiny_cpu_grid without `knob`: the rows at its baseline value, the column and side-car entries gone."""
    side = yaml.safe_load(TABLE.with_suffix(".restart.yaml").read_text())
    keep = side["baseline"][knob]
    lines = TABLE.read_text().splitlines()
    col = lines[0].split(",").index(knob)
    rows = [line.split(",") for line in lines[1:]]
    out = [lines[0].split(",")] + [r for r in rows if r[col] == keep]
    path = tmp / f"without_{knob}.csv"
    path.write_text("\n".join(",".join(c for i, c in enumerate(r) if i != col) for r in out) + "\n")
    for section in side.values():
        if isinstance(section, dict):
            section.pop(knob, None)
    path.with_suffix(".restart.yaml").write_text(yaml.safe_dump(side))
    return path


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """A database with a source study (30 trials of the CPU table), a cold and a warm-started run."""
    path = tmp_path_factory.mktemp("warm") / "db.sqlite"
    _ok(_run(path, "--target", f"replay:{TABLE}", "--study", "src", "--seed", "3", "--max-trials", "30",
             "--no-confirm", "--budget", "10m"))
    common = ("--target", f"replay:{TABLE}", "--seed", SEED, "--max-trials", "3", "--no-confirm", "--budget", "5m")
    _ok(_run(path, *common, "--study", "cold"))
    warm = _ok(_run(path, *common, "--study", "warm", "--warm-start", "src", "--json"))
    (path.parent / "warm.json").write_text(warm.stdout)
    (path.parent / "warm.log").write_text(warm.stderr)
    return path


def _trials(db: Path, study: str) -> list:
    store = Store.open(str(db), create=False)
    try:
        return store.trials(study)
    finally:
        store.close()


def _settings(db: Path, study: str) -> dict:
    store = Store.open(str(db), create=False)
    try:
        return store.runs(study)[-1].settings or {}
    finally:
        store.close()


def test_warm_started_first_proposals_differ_from_a_cold_runs_and_say_so(db):
    cold, warm = _trials(db, "cold"), _trials(db, "warm")
    assert cold[0].params == warm[0].params  # both start at the baseline
    assert [t.params for t in warm[1:3]] != [t.params for t in cold[1:3]]
    first = warm[1].decision
    assert first.reason.startswith("warm start from study 'src': 30 of its 30 successful trials ("), first.reason
    assert first.notes.get("warm_start") == "src: 30 trials"
    assert "warm_start" not in cold[1].decision.notes and "warm start" not in cold[1].decision.reason
    # the other study's evidence is in the model: the cold agent knows nothing of a gain yet
    assert (first.expected_gain or 0) > (cold[1].decision.expected_gain or 0) + 0.05
    recorded = _settings(db, "warm")["warm_start"]
    assert recorded["study"] == "src" and recorded["trials_used"] == 30 and recorded["db"] is None
    assert recorded["configurations"] >= 20 and recorded["filled"] == []
    assert _settings(db, "cold")["warm_start"] is None


def test_summary_and_log_name_the_study_and_the_trials_used(db):
    summary = json.loads((db.parent / "warm.json").read_text())
    assert summary["warm_start"]["study"] == "src" and summary["warm_start"]["trials_used"] == 30
    log = (db.parent / "warm.log").read_text()
    assert "warm start: " in log and "configurations of study 'src'" in log  # the agent's own line
    text = _ok(_run(db, "--target", f"replay:{TABLE}", "--seed", SEED, "--max-trials", "2", "--no-confirm",
                    "--study", "warm2", "--warm-start", "src", "--budget", "5m")).stdout
    assert "warm start: study 'src', 30 of its 30 successful trials (" in text, text


def test_resume_repeats_the_warm_start(db):
    _ok(_run(db, "--resume", "--study", "warm", "--max-trials", "2", "--no-confirm"))
    assert _settings(db, "warm")["warm_start"]["study"] == "src"
    this_run = [t for t in _trials(db, "warm") if t.run_id == max(x.run_id for x in _trials(db, "warm"))]
    searched = [t for t in this_run if not t.is_baseline]
    assert searched and searched[0].decision.reason.startswith("warm start from study 'src'")


def test_another_database_and_a_space_with_fewer_knobs(db, tmp_path):
    other = tmp_path / "other.sqlite"
    _ok(_run(other, "--target", f"replay:{_table_without(tmp_path, 'moe_experts')}", "--study", "no-moe",
             "--seed", "2", "--max-trials", "15", "--no-confirm", "--budget", "10m"))
    _ok(_run(db, "--target", f"replay:{TABLE}", "--seed", SEED, "--max-trials", "2", "--no-confirm",
             "--study", "from-other", "--warm-start", "no-moe", "--warm-start-db", str(other), "--budget", "5m"))
    recorded = _settings(db, "from-other")["warm_start"]
    assert recorded["filled"] == ["moe_experts"] and str(other) in recorded["db"]
    assert recorded["trials_used"] == 15 and len(recorded["shared"]) == 7
    first = _trials(db, "from-other")[1].decision.reason
    assert f"warm start from study 'no-moe' (sqlite:///{other})" in first and \
        "moe_experts read at this space's baseline" in first, first


@pytest.fixture(scope="module")
def bad_db(db) -> Path:
    """The same database plus a study of another space and one whose every trial failed (its baseline
    crashes: the agent tries it three times and stops)."""
    _ok(_run(db, "--target", f"replay:{TILES}", "--study", "tiles", "--seed", "0", "--max-trials", "3",
             "--no-confirm", "--budget", "1h"))
    side = TABLE.with_suffix(".restart.yaml").read_text()
    base = yaml.safe_load(side)["baseline"]
    lines = TABLE.read_text().splitlines()
    head = lines[0].split(",")
    rows = [r.split(",") for r in lines[1:]]
    for r in rows:  # the baseline crashes: nothing of the study has a reference, nothing succeeds
        if all(r[head.index(k)] == v for k, v in base.items()):
            r[head.index("error")] = "crash: always"
    failing = db.parent / "failing.csv"
    failing.write_text("\n".join(",".join(r) for r in [head, *rows]) + "\n")
    failing.with_suffix(".restart.yaml").write_text(side)
    proc = _run(db, "--target", f"replay:{failing}", "--study", "failing", "--max-trials", "2", "--no-confirm")
    assert proc.returncode == 1, proc.stderr[-2000:]  # every trial failed
    return db


@pytest.mark.parametrize("args, message", [
    (["--warm-start", "nosuch"], "error: --warm-start nosuch: no such study in sqlite:///"),
    (["--warm-start", "failing"], "error: --warm-start failing: the study has no successful trial to start from"),
    (["--warm-start", "src", "--strategy", "tpe"],
     "error: --warm-start src: only the agent strategy starts from another study's trials, not --strategy tpe"),
    (["--warm-start", "tiles"], "error: --warm-start tiles: its space shares no knob with this one (its knobs: "
                                "block_kv, heads_per_tile"),
    (["--warm-start", "src", "--study", "src"], "error: --warm-start src: that is this run's own study"),
    (["--warm-start", "src", "--warm-start-db", "missing.sqlite"], "error: --warm-start-db missing.sqlite: "),
    (["--warm-start-db", "db.sqlite"], "error: --warm-start-db db.sqlite: applies with --warm-start STUDY"),
])
def test_bad_warm_start_is_one_line_exit_2_and_records_nothing(bad_db, args, message):
    before = Store.open(str(bad_db), create=False)
    studies = before.studies()
    before.close()
    proc = _run(bad_db, "--target", f"replay:{TABLE}", "--max-trials", "2", *args)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), proc.stderr
    if args[1] == "nosuch":
        assert "(studies there: " in lines[0] and "src" in lines[0] and "tiles" in lines[0]
    after = Store.open(str(bad_db), create=False)
    assert after.studies() == studies  # no run, no study started
    after.close()
