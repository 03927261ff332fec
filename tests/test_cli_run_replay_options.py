"""`autoopt run` options for replay targets: --objective, --minimize/--maximize, --measure-s,
--restart-s. Bad syntax or use with the builtin target: one-line error, exit 2, nothing recorded."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from autoopt.search.session import open_target

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "benchmarks" / "data" / "tiny_cpu_grid.csv"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoopt.cli", "run", "--plain",
                           "--db", f"sqlite:///{tmp_path / 'db.sqlite'}", *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=240)


def test_restart_s_option_sets_the_simulated_switch_cost():
    target = open_target(f"replay:{TABLE}", "replay", "none", {}, 0,
                         {"restart_s": {"attention": 45.0}, "measure_s": 7.0})
    base = target.baseline()
    flipped = dict(base, attention="mma" if base["attention"] == "per_head" else "per_head")
    assert target.transition(flipped).known_s == 45.0
    assert target.measure_s == 7.0


def test_bad_restart_s_is_a_one_line_error(tmp_path):
    proc = _run(tmp_path, "--target", f"replay:{TABLE}", "--restart-s", "attention", "--budget", "1m")
    assert proc.returncode == 2
    assert "--restart-s 'attention': expected KNOB=SECONDS" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_replay_options_are_refused_for_the_builtin_target(tmp_path):
    proc = _run(tmp_path, "--objective", "tok_per_s", "--budget", "10s")
    assert proc.returncode == 2
    assert "apply to a replay target" in proc.stderr


def test_replay_run_with_options_records_trials(tmp_path):
    proc = _run(tmp_path, "--target", f"replay:{TABLE}", "--budget", "5m", "--restart-s",
                "attention=45", "--maximize", "--objective", "tok_per_s", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    from autoopt.store import Store

    store = Store.open(f"sqlite:///{tmp_path / 'db.sqlite'}", create=False)
    (study,) = store.studies()
    assert len(store.trials(study)) >= 3
