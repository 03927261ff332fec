"""kill -9 of a real `autoopt run` at a moment when one trial has finished and another is running:
nothing recorded is lost, and running again (here with --resume) marks the running trial
interrupted, re-runs that configuration first, and continues."""
from __future__ import annotations

import os
import signal

import pytest

from cli_helpers import run_autoopt, runs, start_autoopt, trials, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
FINISHED = ("ok", "wrong", "failed")


def test_kill_9_then_resume(tmp_path):
    db, log = tmp_path / "t.sqlite", tmp_path / "run.log"
    proc = start_autoopt("run", "--db", str(db), "--budget", "20m", "--strategy", "random", "--seed", "3",
                         "--study", "k9", "--plain", log=log)
    try:
        def finished_and_running():
            rows = trials(db, "k9")
            done = [r for r in rows if r.state in FINISHED]
            running = [r for r in rows if r.state == "running"]
            return rows if done and running else None

        wait_for(finished_and_running, 300, proc, ">= 1 finished trial and one running", log)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    before = trials(db, "k9")  # what the killed process left, read after it died
    done_before = {r.number: (r.state, r.objective, r.params) for r in before if r.state in FINISHED}
    (victim,) = [r for r in before if r.state == "running"]
    assert done_before and 0 in done_before and victim.number > 0

    out = run_autoopt("run", "--db", str(db), "--resume", "--max-trials", "2", "--budget", "5m",
                      "--no-confirm")
    assert out.returncode == 0, out.stderr[-3000:]

    after = trials(db, "k9")
    by_number = {r.number: r for r in after}
    for number, (state, objective, params) in done_before.items():  # nothing recorded was lost
        r = by_number[number]
        assert (r.state, r.objective, r.params) == (state, objective, params)
    marked = by_number[victim.number]
    assert marked.state == "interrupted" and marked.failure.kind == "interrupted"
    assert "ended before the trial finished" in marked.failure.reason
    new = [r for r in after if r.number > max(t.number for t in before)]
    assert len(new) == 2  # the resumed run's own baseline (every run measures it), then the re-run
    assert new[0].decision.source == "baseline" and new[0].is_baseline
    assert new[1].params == victim.params and new[1].decision.source == "resume"
    assert new[1].decision.rerun_of == victim.number
    assert all(r.state in FINISHED for r in new)
    assert not [r for r in after if r.state == "running"]
    killed, resumed = runs(db, "k9")
    assert killed.state == "interrupted"
    assert resumed.state == "finished" and resumed.settings["strategy"] == "random"
    assert resumed.seed == 3 + 1  # --resume took the recorded settings (seed stream moved on)
