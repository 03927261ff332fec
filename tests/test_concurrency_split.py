"""benchmarks/concurrency_split.py: the predictions of the objective's change from one profile, checked
on rows built so that one of them is exact (a real subprocess on a CSV it reads like the H200 table)."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "concurrency_split.py"


def row(host_ms: float, device_ms_at: dict[int, float]) -> dict[str, object]:
    """A configuration whose host time is the same at every C and whose device time is given per C:
    tok/s at C is C / (host + device) steps; the profile at C = 64 sees host + device(64)."""
    r: dict[str, object] = {"error": "", "metric_host_ms": host_ms,
                            "metric_device_busy_ms": device_ms_at[64],
                            "metric_step_wall_ms": host_ms + device_ms_at[64]}
    for c, dev in device_ms_at.items():
        r[f"metric_tok_per_s_{c}"] = c / ((host_ms + dev) / 1000.0)
    return r


def test_host_fixed_over_c_is_exact_where_its_assumption_holds(tmp_path):
    # device time scales by the same factor at every C between the rows: the assumption of the
    # "host fixed over C" predictor, so it is exact; the one-concurrency rules are not (a host cut
    # weighs more at C = 1, where the host is most of the step)
    rows = [row(40.0, {1: 5.0, 16: 12.0, 64: 40.0}),
            row(4.0, {1: 5.0, 16: 12.0, 64: 40.0}),      # CUDA graphs: host 40 -> 4 ms
            row(40.0, {1: 2.5, 16: 6.0, 64: 20.0})]      # a kernel twice as fast
    table = tmp_path / "table.csv"
    with table.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    out = tmp_path / "split.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--table", str(table), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["rows"] == 3 and doc["pairs"] == 6
    s = doc["summary"]
    assert s["host fixed over C"]["p90_abs_log_error"] < 1e-9
    assert s["profile at C=64"]["median_abs_log_error"] > 0.05
    assert s["true C=64 tok/s"]["median_abs_log_error"] > 0.05
    assert "6 ordered pairs" in done.stdout
