"""A run whose own trials all failed, beside a run on the same study whose baseline worked: it shared
that baseline, its failures are data, and it exits 0. Alone (every trial of it failed, the baseline
too) a run exits 1: tests/test_loop.py. Seen on CI: of four concurrent `autoopt run` processes, one
that joined late shared the baseline, measured one configuration the table records as failing, and
exited 1 "every trial of this run failed" (tests/test_concurrent_runs.py)."""
from __future__ import annotations

from pathlib import Path

from autoopt.search.budget import Budget
from autoopt.search.loop import LoopSettings, SearchLoop
from autoopt.search.observer import NullObserver
from autoopt.search.strategy import Decision, Stop
from autoopt.store import Store
from autoopt.targets.replay.target import ReplayTarget, replay_space

TABLE = Path(__file__).resolve().parent / "fixtures" / "replay" / "casestudy.csv"
FAILS = {"indexer_gemm": "fp8", "cuda_graphs": "on"}  # the table: fp8 indexer GEMM cannot be captured


class _Script:
    """Proposes the given configurations (changes from the baseline), then stops."""

    name = "script"

    def __init__(self, space, changes):
        self.space, self.changes = space, list(changes)

    def propose(self, ctx):
        if not self.changes:
            return Stop("script done")
        return Decision(dict(self.space.baseline_params(), **self.changes.pop(0)), "scripted", "scripted")

    def observe(self, outcome, ctx):
        """A script learns nothing from what it measured."""


class _StartBesideAfterBaseline(NullObserver):
    """Starts run B while run A is live, right after A's baseline is recorded."""

    def __init__(self, start):
        self.start, self.result = start, None

    def trial_finished(self, outcome, best, baseline, budget):
        if self.result is None:
            self.result = self.start()


def _loop(store, target, space, changes, observer=None):
    run_id = store.start_run("s", "test", space.name, space.sha256, "replay", None, 1,
                             {"objective": f"tok_per_s@{target.concurrency}"})
    return SearchLoop(store, target, space, _Script(space, changes), Budget(3600.0, clock=target.now),
                      LoopSettings(study_name="s", handle_sigint=False), observer=observer, run_id=run_id)


def test_a_run_whose_trials_failed_beside_a_working_shared_baseline_exits_0(tmp_path):
    target = ReplayTarget(TABLE, seed=1)
    space = replay_space(target)
    store = Store.open(str(tmp_path / "t.sqlite"))
    beside = _StartBesideAfterBaseline(lambda: _loop(store, ReplayTarget(TABLE, seed=2), space, [FAILS]).run())
    a = _loop(store, target, space, [], observer=beside).run()
    b = beside.result
    assert a.exit_code == 0 and b is not None
    assert [t.result.ok for t in b.trials] == [False]  # B measured one configuration: it failed
    assert b.baseline is not None and b.baseline.number == a.baseline.number  # A's baseline, shared
    assert b.exit_code == 0 and b.state == "finished", b.stop_reason
    assert {r.id: r.state for r in store.runs("s")} == {a.run_id: "finished", b.run_id: "finished"}

