"""What the run summary says of the run's predictions: predicted vs actual transition seconds per trial
and their agreement, and the agent's calibration (its measured gains inside their predicted 95 %
interval; the count itself: tests/test_gain_calibration.py). A real `autoopt run` on a replay table
whose every new configuration compiles (tests/fixtures/replay/tiles.csv)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from autoopt.search.run_types import TRANSITION_FLOOR_S, transition_within

TILES = Path(__file__).resolve().parent / "fixtures" / "replay" / "tiles.csv"


def test_within_means_within_half_the_prediction_or_half_a_second():
    assert transition_within(10.0, 14.9) and transition_within(10.0, 5.1)
    assert not transition_within(10.0, 15.2) and not transition_within(10.0, 4.8)
    assert transition_within(0.0, 0.4) and not transition_within(0.0, 0.7)  # a fresh "free" switch that was not


def _run(tmp_path: Path, *args: str, max_trials: int = 10) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "autoopt.cli", "run", "--plain", "--db", str(tmp_path / "db.sqlite"),
                           "--target", f"replay:{TILES}", "--seed", "4", "--max-trials", str(max_trials),
                           "--budget", "2h", *args], capture_output=True, text=True, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_summary_counts_the_trials_predicted_within_50_percent(tmp_path):
    doc = json.loads(_run(tmp_path, "--json").stdout)
    ran = [t for t in doc["trials"] if t["status"] in ("ok", "wrong")]
    assert all(t["transition_s"] is None for t in doc["trials"] if t not in ran)  # cut short: not counted
    pairs = [t["transition_s"] for t in ran]
    assert all(p is not None for p in pairs)  # every trial that ran carries the cost model's prediction
    assert any(p["actual"] > 1.0 for p in pairs)  # compiles (the table's compile_s): something to predict
    summary = doc["transitions"]
    assert summary["trials"] == len(pairs)
    within = sum(transition_within(p["predicted"], p["actual"]) for p in pairs)
    assert summary["within_50pct"] == within and within >= 1
    errors = sorted(abs(p["actual"] - p["predicted"]) for p in pairs)
    assert abs(summary["median_error_s"] - (errors[(len(errors) - 1) // 2] + errors[len(errors) // 2]) / 2) < 1e-9
    # the ratio's median is over the trials predicted above the floor only, and says how many
    assert summary["trials_predicted_above_floor"] == sum(p["predicted"] > TRANSITION_FLOOR_S for p in pairs)
    text = _run(tmp_path, "--study", "plain").stdout
    assert "transitions: " in text and " trials that ran (" in text and "within 50% of the predicted seconds; median error" in text
    if "actual/predicted median" in text:  # a ratio names how many trials it is the median of
        assert re.search(r"actual/predicted median x[0-9.]+ over the [0-9]+ predicted above 0.5s", text)


def test_run_prints_and_reports_its_calibration_and_says_nothing_without_predictions(tmp_path):
    doc = json.loads(_run(tmp_path, "--json", max_trials=25).stdout)  # most of tiles' trials fail: 25 for a few
    calib = doc["calibration"]
    assert calib["trials"] >= 3 and 0 <= calib["inside_95pct"] <= calib["trials"]
    assert abs(calib["share_inside_95pct"] - calib["inside_95pct"] / calib["trials"]) < 1e-12
    text = _run(tmp_path, "--study", "plain", max_trials=25).stdout
    assert "measured gains (" in text and "inside the 95% interval predicted when the trial was chosen" in text
    # random search predicts no gain: no line, and null in the JSON (not 0 of 0)
    doc = json.loads(_run(tmp_path, "--study", "random", "--strategy", "random", "--json").stdout)
    assert doc["calibration"] is None
    assert "calibration:" not in _run(tmp_path, "--study", "random2", "--strategy", "random").stdout
