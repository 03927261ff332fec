"""`autoopt run`, `best` and `suggest` on a Kernel Tuner table (objective `time` in ms, minimised), in
real subprocesses on a real SQLite file: every figure they print about the objective is the table's
time in ms with "lower is better", never its reciprocal as "tok/s" (issue 12 item 7); `--json` carries
the unit (analysis.ObjectiveUnit.to_json). The reading commands are tested in test_history_sessions."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KT_TABLE = ROOT / "tests" / "fixtures" / "replay" / "kt_gemm.json"
KNOBS = ("block_size_x", "block_size_y", "tile_size_x")
TIME_MS = {"quantity": "time", "unit": "ms", "direction": "minimize"}


def autoopt(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "AUTOOPT_DB"}
    return subprocess.run([sys.executable, "-m", "autoopt.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**env, "COLUMNS": "200"})


def run_args(table: Path, db: Path, *extra: str) -> tuple[str, ...]:
    return ("run", "--target", f"replay:{table}", "--strategy", "random", "--max-trials", "4",
            "--budget", "1000h", "--study", "kt", "--db", str(db), "--seed", "3", *extra)


def recorded_ms() -> dict[tuple, float]:
    cache = json.loads(KT_TABLE.read_text())["cache"]
    return {tuple(v[k] for k in KNOBS): v["time"] for v in cache.values() if isinstance(v.get("time"), (int, float))}


def ms_of(params: dict) -> float:
    return recorded_ms()[tuple(params[k] for k in KNOBS)]


def unit_of(doc: dict) -> dict:
    return {k: doc["objective_unit"][k] for k in TIME_MS}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("kt")
    table = tmp / "kt_gemm.json"  # no side-car YAML: no noise, every figure is the table's own
    shutil.copy(KT_TABLE, table)
    return table, tmp / "kt.sqlite"


@pytest.fixture(scope="module")
def plain_run(study: tuple[Path, Path]) -> subprocess.CompletedProcess:
    table, db = study
    out = autoopt(*run_args(table, db, "--plain"))
    assert out.returncode == 0, out.stderr
    return out


def test_run_prints_the_best_in_ms_lower_is_better(plain_run: subprocess.CompletedProcess,
                                                   study: tuple[Path, Path]) -> None:
    summary, log = plain_run.stdout, plain_run.stderr
    assert "tok/s" not in summary and "tok/s" not in log, summary + log
    assert "objective: time in ms, lower is better" in summary
    assert "objective: time in ms, lower is better (as the replay table records it)" in log
    best = re.search(r"^best #(\d+): ([0-9.]+) ms ±", summary, re.M)
    assert best, summary
    doc = json.loads(autoopt("show", best.group(1), "--db", str(study[1]), "--json").stdout)
    assert float(best.group(2)) == pytest.approx(ms_of(doc["trial"]["params"]), rel=1e-3)
    base = re.search(r"^baseline #0: ([0-9.]+) ms", summary, re.M)
    assert base and float(base.group(1)) > float(best.group(2))  # lower is better: the best is faster
    for line in log.splitlines():  # every measured trial in ms, the confirmation's reason too
        if re.search(r"trial #\d+ ok:", line):
            assert re.search(r"ok: [0-9.]+ ms ±", line), line
    assert re.search(r"re-measure the best \(trial #\d+, [0-9.]+ ms\)", log), log


def test_run_live_panel_shows_ms(study: tuple[Path, Path], tmp_path: Path) -> None:
    out = autoopt(*run_args(study[0], tmp_path / "live.sqlite", "--live"))
    assert out.returncode == 0, out.stderr
    panel = out.stderr  # rich's last frame on a pipe
    assert "objective time in ms (lower is better)" in panel and "tok/s" not in panel, panel
    assert re.search(r"^best +#\d+ .* [0-9.]+ ms ±", panel, re.M), panel


def test_run_json_carries_the_unit(study: tuple[Path, Path], tmp_path: Path) -> None:
    out = autoopt(*run_args(study[0], tmp_path / "json.sqlite", "--json"))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert unit_of(doc) == TIME_MS and doc["objective_unit"]["text"] == "time in ms, lower is better"
    for t in [doc["best"], doc["baseline"], *doc["trials"]]:
        if t["objective"] is not None:  # the stored rate stays; the value is the table's ms
            assert t["objective_value"]["median"] == pytest.approx(ms_of(t["params"]))
            assert t["objective_value"]["median"] == pytest.approx(1 / t["objective"])


def test_best_and_suggest_carry_the_unit(plain_run: subprocess.CompletedProcess,
                                         study: tuple[Path, Path]) -> None:
    db = str(study[1])
    best = autoopt("best", "--db", db, "--json")
    assert best.returncode == 0, best.stderr
    doc = json.loads(best.stdout)
    assert unit_of(doc) == TIME_MS
    assert doc["values"]["1"]["median"] == pytest.approx(ms_of(doc["trial"]["params"]))
    text = autoopt("best", "--db", db)
    assert "time in ms, lower is better" in text.stdout and "tok/s" not in text.stdout, text.stdout
    suggest = autoopt("suggest", "--db", db, "--json")  # the replay space is rebuilt from the table
    assert suggest.returncode == 0, suggest.stderr
    advice = json.loads(suggest.stdout)
    assert unit_of(advice) == TIME_MS and advice["action"] in ("try", "stop")
    text = autoopt("suggest", "--db", db)
    assert text.returncode == 0, text.stderr
    assert "objective: time in ms, lower is better" in text.stdout and "tok/s" not in text.stdout, text.stdout


def test_suggest_names_a_replay_table_that_is_gone(study: tuple[Path, Path], tmp_path: Path) -> None:
    table, db = tmp_path / "gone.json", tmp_path / "gone.sqlite"
    shutil.copy(KT_TABLE, table)
    assert autoopt(*run_args(table, db, "--plain", "--no-confirm")).returncode == 0
    table.unlink()
    out = autoopt("suggest", "--db", str(db))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("error: ") and str(table) in out.stderr and "--space" in out.stderr
