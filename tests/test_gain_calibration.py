"""The run summary's calibration: the share of this run's measured gains that fell inside the 95 %
interval the agent predicted when it chose each trial (issue 14, item 2: printed in `bench-search`
and in the run summary). One definition (autoopt.search.run_types.gain_inside) serves the run
summary, `autoopt run --json` and `bench-search`; it must count what the agent's own calibration
counted, trial by trial. The summary's line and JSON from a real `autoopt run`:
tests/test_transition_accuracy.py."""
from __future__ import annotations

from pathlib import Path

from autoopt.search import registry as strategies
from autoopt.search.budget import Budget
from autoopt.search.loop import LoopSettings, SearchLoop
from autoopt.search.run_types import Z95, gain_calibration
from autoopt.store import Store
from autoopt.targets.replay.target import ReplayTarget, replay_space

TILES = Path(__file__).resolve().parent / "fixtures" / "replay" / "tiles.csv"


def test_the_summary_counts_what_the_agent_scored(tmp_path):
    target = ReplayTarget(TILES, seed=3)
    space = replay_space(target)
    agent = strategies.get("agent", space, 3)
    store = Store.open(str(tmp_path / "db.sqlite"))
    run_id = store.start_run("calib", "test", space.name, space.sha256, "replay", None, 3, {})
    loop = SearchLoop(store, target, space, agent, Budget(total_s=1800, clock=target.now),
                      LoopSettings(study_name="calib", handle_sigint=False, max_trials=25), run_id=run_id)
    result = loop.run()
    calibration = result.gain_calibration()
    own = agent.calibration.z  # the agent's misses in sds, one per scored trial, as it made them
    assert calibration is not None and calibration.n == len(own) >= 5
    assert calibration.inside == sum(abs(z) <= Z95 for z in own)
    assert 0 < calibration.inside <= calibration.n
    # the baseline and the final confirmation carry no prediction: not counted
    assert calibration.n < sum(1 for t in result.trials if t.objective is not None)
    assert gain_calibration(result.trials, None) is None  # no baseline: nothing to measure a gain from
