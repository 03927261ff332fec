"""optuna-dashboard reads autoopt's database as it is (the README says so): a real dashboard server on
loopback, started on the SQLite file a real `autoopt run` wrote, answers its HTTP API with the study
and every trial, their parameters and values.

The run drives the replay target (simulated clock), so the test checks the store's shape, not speed.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from cli_helpers import env, free_port, run_autoopt, trials

pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed (it is in the test extras)")
pytestmark = pytest.mark.timeout(300)
CASE = Path(__file__).resolve().parent / "fixtures" / "replay" / "casestudy.csv"
_DASHBOARD = "import sys; from optuna_dashboard._cli import main; sys.argv[0] = 'optuna-dashboard'; main()"



def _get(url: str, deadline: float, proc: subprocess.Popen) -> dict:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def test_dashboard_serves_the_study_autoopt_recorded(tmp_path):
    db = tmp_path / "autoopt.sqlite"
    out = run_autoopt("run", "--target", f"replay:{CASE}", "--db", str(db), "--study", "dash",
                      "--budget", "2h", "--max-trials", "5", "--plain")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    recorded = trials(db, "dash")
    port = free_port()
    log = open(tmp_path / "dashboard.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", _DASHBOARD, f"sqlite:///{db}", "--host", "127.0.0.1",
                             "--port", str(port)], env=env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}/api/studies"
        deadline = time.monotonic() + 60
        studies = _get(base, deadline, proc)["study_summaries"]
        (study,) = [s for s in studies if s["study_name"] == "dash"]
        assert study["directions"] == ["maximize"]
        detail = _get(f"{base}/{study['study_id']}", deadline, proc)
        numbers = sorted(t["number"] for t in detail["trials"])
        assert numbers == sorted(r.number for r in recorded)
        baseline = next(t for t in detail["trials"] if t["number"] == 0)
        assert baseline["state"] == "Complete" and baseline["values"]
        assert {p["name"] for p in baseline["params"]} >= {"mhc_gemm", "attention", "cuda_graphs"}
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
