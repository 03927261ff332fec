"""The run summary's calibration: the share of this run's measured gains that fell inside the 95 %
interval the agent predicted when it chose each trial (issue 14, item 2: printed in `bench-search`
and in the run summary). One definition (autoopt.search.run_types.gain_inside) serves the run
summary, `autoopt run --json` and `bench-search`; it must count what the agent's own calibration
counted, trial by trial. The summary's line and JSON from a real `autoopt run`:
tests/test_transition_accuracy.py."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from autoopt.search import registry as strategies
from autoopt.search.budget import Budget
from autoopt.search.loop import LoopSettings, SearchLoop
from autoopt.search.run_types import Z95, gain_calibration
from autoopt.store import Store
from autoopt.targets.replay.target import ReplayTarget, replay_space

TILES = Path(__file__).resolve().parent / "fixtures" / "replay" / "tiles.csv"


def _agent_run(tmp_path):
    """The agent on tiles.csv for 25 trials with a real SQLite store: the run and the agent."""
    target = ReplayTarget(TILES, seed=3)
    space = replay_space(target)
    agent = strategies.get("agent", space, 3)
    store = Store.open(str(tmp_path / "db.sqlite"))
    run_id = store.start_run("calib", "test", space.name, space.sha256, "replay", None, 3, {})
    loop = SearchLoop(store, target, space, agent, Budget(total_s=1800, clock=target.now),
                      LoopSettings(study_name="calib", handle_sigint=False, max_trials=25), run_id=run_id)
    return loop.run(), agent


def test_the_summary_counts_what_the_agent_scored(tmp_path):
    result, agent = _agent_run(tmp_path)
    calibration = result.gain_calibration()
    own = agent.calibration.z  # the agent's misses in sds, one per scored trial, as it made them
    assert calibration is not None and calibration.n == len(own) >= 5
    assert calibration.inside == sum(abs(z) <= Z95 for z in own)
    assert 0 < calibration.inside <= calibration.n
    # the baseline and the final confirmation carry no prediction: not counted
    assert calibration.n < sum(1 for t in result.trials if t.objective is not None)
    # each prediction names the reference it was made against: the study's first baseline
    scored = [t for t in result.trials if t.decision is not None and t.decision.notes.get("pred_log") is not None]
    assert {t.decision.notes["ref_log"] for t in scored} == {math.log(result.baseline.objective)}


def test_a_resumed_runs_own_baseline_does_not_move_the_count(tmp_path):
    """A resumed run measures its own baseline, and the agent still reads every gain against the
    study's first one. On the H100 a resume's baseline read 6 % above the study's first, and the run
    summary, reading the predictions against it, printed 9 of 114 inside their interval (the agent's
    own count: 111). The count follows the prediction's reference, whatever baseline is passed."""
    result, _ = _agent_run(tmp_path)
    calibration = result.gain_calibration()
    assert calibration is not None and calibration.n >= 5
    for shift in (1.06, 1.5):  # the resume's baseline, read above the first (1.5: past any interval)
        drifted = replace(result.baseline, result=replace(result.baseline.result,
                                                          objective=result.baseline.objective * shift))
        assert gain_calibration(result.trials, drifted) == calibration
    assert gain_calibration(result.trials, None) == calibration  # no run baseline: the notes' reference
    # a record without the reference (a study written before it was noted) is read against the baseline
    for t in result.trials:
        if t.decision is not None:
            t.decision.notes.pop("ref_log", None)
    assert gain_calibration(result.trials, result.baseline) == calibration
    assert gain_calibration(result.trials, None) is None  # no reference at all: nothing to count
