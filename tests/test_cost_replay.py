"""benchmarks/cost_replay.py, run as a user runs it, on a live study committed under
benchmarks/results: one study, and several pooled (the figure benchmarks/README.md quotes for the
cost model, share of transitions within 50 %, comes from the pooled form)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "benchmarks" / "results" / "h200_live_10m_run8" / "h200.sqlite"


def replay(tmp_path: Path, *dbs: Path) -> dict:
    out = tmp_path / "replay.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cost_replay.py"), "--db", *map(str, dbs),
                           "--study", "flash-h200", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


def test_one_study_and_the_same_study_twice_pooled(tmp_path):
    one = replay(tmp_path, STUDY)
    runs = one["summary"]
    assert set(runs) == {"1"} and runs["1"]["trials"] == len(one["trials"]) == 18
    assert 0 < runs["1"]["within_now"] <= 18
    for row in one["trials"]:  # each replayed transition: what was predicted beside what it took
        assert row["predicted_s"] >= 0 and row["actual_s"] >= 0
    two = replay(tmp_path, STUDY, STUDY)
    assert len(two["studies"]) == 2 and two["studies"][0]["summary"] == runs
    assert two["pooled"]["all"] == {k: 2 * v for k, v in runs["1"].items()}
    assert two["pooled"]["1"] == two["pooled"]["all"]  # a study of one run: it ran from empty
