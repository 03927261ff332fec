"""The search loop, budget and strategies against real parts: a real SQLite store and the replay target
(recorded table, simulated clock: deterministic and instant). Budget arithmetic and the strategy
registry: tests/test_budget_registry.py."""
from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest

from autoopt.search import registry as strategies, resume
from autoopt.search.budget import Budget
from autoopt.cli.live_view import LiveView
from autoopt.search.loop import LoopSettings, SearchLoop
from autoopt.space.space import SearchSpace, TargetInfo
from autoopt.store import Store
from autoopt.targets.replay.target import ReplayTarget, replay_space

TABLE = Path(__file__).resolve().parent / "fixtures" / "replay" / "casestudy.csv"


# ---- the loop on a replay target and a real store ------------------------------------------------
def _loop(tmp_path: Path, strategy: str = "tpe", budget_s: float = 3600.0, max_trials: int | None = None,
          space=None, target=None, observer=None, study: str = "s", seed: int = 1):
    target = target or ReplayTarget(TABLE, seed=seed)
    space = space or replay_space(target)
    store = Store.open(str(tmp_path / "t.sqlite"))
    budget = Budget(budget_s, clock=target.now)
    run_id = store.start_run(study, "test", space.name, space.sha256, "replay", None, seed,
                             {"objective": f"tok_per_s@{target.concurrency}"})
    loop = SearchLoop(store, target, space, strategies.get(strategy, space, seed), budget,
                      LoopSettings(study_name=study, max_trials=max_trials, handle_sigint=False),
                      observer=observer, run_id=run_id)
    return loop, store


@pytest.mark.parametrize("strategy", ["tpe", "random"])
def test_budget_is_never_overspent_and_the_best_is_confirmed(tmp_path, strategy):
    loop, store = _loop(tmp_path, strategy, budget_s=3600.0)
    result = loop.run()
    assert result.exit_code == 0 and result.state == "finished"
    assert loop.target.now() <= 3600.0 + 1e-6  # simulated seconds, restarts and compiles included
    rows = store.trials("s")
    assert len(rows) == len(result.trials) >= 10
    assert rows[0].number == 0 and rows[0].is_baseline and rows[0].decision.source == "baseline"
    assert rows[-1].decision.source == "confirm"
    assert rows[-1].params == result.best.params
    assert rows[0].state == "ok" and sum(r.state == "ok" for r in rows) >= len(rows) // 2
    assert all(r.state in ("ok", "failed") for r in rows)  # failed: rows the table records as failing
    keys = [loop.space.config_key(r.params) for r in rows[:-1]]
    assert len(keys) == len(set(keys)), "a sampler strategy re-measured a configuration"
    run = store.runs("s")[-1]
    assert run.state == "finished" and run.stop_reason == result.stop_reason
    assert result.best.objective >= result.baseline.objective


def test_max_trials_counts_search_trials_and_confirmation_is_extra(tmp_path):
    loop, store = _loop(tmp_path, "random", max_trials=4)
    result = loop.run()
    assert result.stop_reason == "max trials reached (4)"
    sources = [r.decision.source for r in store.trials("s")]
    assert sources[0] == "baseline" and len(sources) in (4, 5)
    assert sources[-1] == "confirm" or result.best is result.baseline


def test_a_trial_that_does_not_fit_is_not_started(tmp_path):
    # the first evaluation pays a fresh start (300 s) + 120 s of measurement: 500 s hold that only
    loop, store = _loop(tmp_path, "random", budget_s=500.0)
    result = loop.run()
    assert result.stop_reason.startswith(("budget", "strategy stopped"))
    assert loop.target.now() <= 500.0 + 1e-6
    assert result.exit_code == 0 and [r.number for r in store.trials("s")] == [0]


def test_a_budget_too_small_for_the_baseline_starts_nothing(tmp_path):
    loop, store = _loop(tmp_path, "random", budget_s=200.0)
    result = loop.run()
    assert result.stop_reason.startswith("budget: next trial expected to take")
    assert loop.target.now() == 0.0 and store.trials("s") == [] and result.exit_code == 0


def test_constraints_hold_for_every_proposed_trial(tmp_path):
    target = ReplayTarget(TABLE, seed=2)
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent("""\
        name: constrained
        target: replay
        concurrency: [64]
        objective: {concurrency: 64}
        knobs:
          mhc_gemm: {values: [fp32, bf16], restart_class: none}
          mhc_operand: {values: [cast_from_fp32, view_bf16_residual], restart_class: none}
          attention: {values: [per_head, mma], restart_class: recompile}
          moe_experts: {values: [loop, grouped], restart_class: none}
        constraints:
          - "mhc_operand == 'cast_from_fp32' or mhc_gemm == 'bf16'"
        """))
    space = SearchSpace.load(path, TargetInfo.from_target(target))
    loop, store = _loop(tmp_path, "tpe", space=space, target=target, budget_s=1e6)
    result = loop.run()
    assert "exhausted" in result.stop_reason  # 12 feasible of 16: all measured, then a clean stop
    rows = [r for r in store.trials("s") if r.decision.source != "confirm"]
    assert len(rows) == 12
    assert all(r.params["mhc_operand"] == "cast_from_fp32" or r.params["mhc_gemm"] == "bf16" for r in rows)


def test_running_trials_of_a_dead_process_are_rerun_first(tmp_path):
    target = ReplayTarget(TABLE, seed=3)
    space = replay_space(target)
    dead = Store.open(str(tmp_path / "t.sqlite"))
    run = dead.start_run("s", "killed", space.name, space.sha256, "replay", None, 3, {})
    h0 = dead.begin_trial(run, "s", space.baseline_params(), space.params_to_config(space.baseline_params()), None)
    from autoopt.search.strategy import Decision

    params = dict(space.baseline_params(), attention="mma")
    h1 = dead.begin_trial(run, "s", params, space.params_to_config(params),
                          Decision(params, "sampler:tpe", "from the killed run"))
    dead.close()  # never finished: as if kill -9 hit while trial 1 was measuring
    assert (h0.number, h1.number) == (0, 1)
    loop, store = _loop(tmp_path, "random", space=space, target=target, max_trials=3)
    result = loop.run()
    rows = store.trials("s")
    assert [r.state for r in rows[:2]] == ["interrupted", "interrupted"]
    assert rows[2].decision.source == "baseline" and rows[2].decision.rerun_of == 0
    assert rows[3].decision.source == "resume" and rows[3].params == params
    assert rows[3].decision.rerun_of == 1
    assert result.exit_code == 0
    # a third run measures its own baseline (every run does) and does not re-run them again
    loop2, store2 = _loop(tmp_path, "random", space=space, target=ReplayTarget(TABLE, seed=4), max_trials=2)
    loop2.run()
    assert [r.decision.source for r in store2.trials("s")[len(rows):]] == ["baseline", "sampler:random"]


def test_every_trial_failing_exits_1(tmp_path):
    table = tmp_path / "bad.csv"  # the one working row (a=w) lies outside the space below
    table.write_text("a,b,tok_per_s,error\n" + "".join(
        f"{a},{b},,broken kernel\n" for a in ("x", "y", "z") for b in ("p", "q", "r")) + "w,p,10.0,\n")
    target = ReplayTarget(table, seed=0)
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\ntarget: replay\nconcurrency: [1]\nknobs:\n"
                    "  a: {values: [x, y, z]}\n  b: {values: [p, q, r]}\n")
    space = SearchSpace.load(path, TargetInfo.from_target(target))
    loop, store = _loop(tmp_path, "random", target=target, space=space)
    result = loop.run()
    assert result.exit_code == 1 and result.state == "failed"
    assert "none ever succeeded" in result.stop_reason and "broken kernel" in result.stop_reason
    assert store.runs("s")[-1].state == "failed"
    assert all(r.state == "failed" for r in store.trials("s"))


def test_plain_log_lines(tmp_path):
    out = io.StringIO()
    loop, _ = _loop(tmp_path, "random", max_trials=3, observer=LiveView(live=False, stream=out))
    loop.run()
    text = out.getvalue()
    assert "trial #0 start [baseline" in text and "trial #0 ok:" in text and "tok/s" in text
    assert "best #" in text and "stop: max trials reached (3)" in text
    assert "\x1b[" not in text  # no terminal control codes when not a TTY


def test_live_panel_renders(tmp_path):
    from rich.console import Console

    view = LiveView(live=False, stream=io.StringIO())
    loop, _ = _loop(tmp_path, "random", max_trials=3, observer=view)
    loop.run()
    console = Console(file=io.StringIO(), width=100, record=True)
    console.print(view._render())
    text = console.export_text()
    assert "budget" in text and "best" in text and "vs baseline" in text


def test_gp_strategy_runs(tmp_path):
    loop, store = _loop(tmp_path, "gp", max_trials=6)
    assert loop.run().exit_code == 0
    assert len(store.trials("s")) >= 6


# ---- what the user is told is best; diagnoses stored with their trials ----------------------------
class _Scripted:
    """Proposes the given changes from the baseline, in order, then stops. `pick` (a change) plays an
    agent whose working incumbent is a configuration slower than the baseline."""

    name = "scripted"

    def __init__(self, space, changes, pick=None, parent=None, gain=None):
        self.space, self.changes, self.pick = space, list(changes), pick
        self.parent, self.gain = parent, gain

    def _params(self, change):
        return dict(self.space.baseline_params(), **change)

    def propose(self, ctx):
        from autoopt.search.strategy import Decision, Stop

        if not ctx.history:
            return Decision(self.space.baseline_params(), "baseline", "trial 0")
        if not self.changes:
            return Stop("script done")
        change = self.changes.pop(0)
        return Decision(self._params(change), "scripted", f"try {change}", expected_gain=self.gain,
                        expected_gain_sd=0.04 if self.gain is not None else None, parent=self.parent)

    def observe(self, outcome, ctx):
        pass

    def best_params(self):
        return self._params(self.pick) if self.pick is not None else None


def _best_doc(store, study="s"):
    from autoopt.store.reports import best

    doc, chosen, _ = best(store, study, current=lambda device: {})
    return doc, chosen


def test_the_reported_best_is_the_rule_of_autoopt_best_not_the_strategys_pick(tmp_path):
    """A strategy whose own incumbent is slower than the baseline (attn_block_kv=32) must not make
    `autoopt run` call that the best: live view, result and confirmation follow `autoopt best`."""
    target = ReplayTarget(TABLE, seed=1)
    space = replay_space(target)
    changes = [{"attn_block_kv": 32}, {"attention": "mma"}, {"moe_experts": "grouped"}]
    out = io.StringIO()
    store = Store.open(str(tmp_path / "t.sqlite"))
    run_id = store.start_run("s", "test", space.name, space.sha256, "replay", None, 1,
                             {"objective": f"tok_per_s@{target.concurrency}"})
    loop = SearchLoop(store, target, space, _Scripted(space, changes, pick={"attn_block_kv": 32}),
                      Budget(1e6, clock=target.now), LoopSettings(study_name="s", handle_sigint=False),
                      observer=LiveView(live=False, stream=out), run_id=run_id)
    result = loop.run()
    rows = store.trials("s")
    mma = next(r for r in rows if r.params["attention"] == "mma")
    doc, chosen = _best_doc(store)
    assert doc["significant"] and chosen.number == mma.number
    assert result.best.number == mma.number and result.best.objective > result.baseline.objective_ci[1]
    assert result.confirmation.params == mma.params  # the confirmation re-measured that best
    assert rows[-1].decision.source == "confirm" and rows[-1].decision.confirms == mma.number
    lines = [ln for ln in out.getvalue().splitlines() if " ok: " in ln]
    assert f"best #{mma.number} ×" in lines[-2]  # the live view's best after the search, before confirming
    slow = next(r for r in rows if r.params["attn_block_kv"] == 32)
    assert f"best #{slow.number} " not in out.getvalue()


def test_the_baseline_stays_best_when_nothing_beats_it_outside_the_noise(tmp_path):
    target = ReplayTarget(TABLE, seed=1)
    space = replay_space(target)
    out = io.StringIO()
    store = Store.open(str(tmp_path / "t.sqlite"))
    run_id = store.start_run("s", "test", space.name, space.sha256, "replay", None, 1,
                             {"objective": f"tok_per_s@{target.concurrency}"})
    strategy = _Scripted(space, [{"attn_block_kv": 32}, {"hc_fn_weight": "cached"}], pick={"attn_block_kv": 32})
    loop = SearchLoop(store, target, space, strategy, Budget(1e6, clock=target.now),
                      LoopSettings(study_name="s", handle_sigint=False),
                      observer=LiveView(live=False, stream=out), run_id=run_id)
    result = loop.run()
    doc, chosen = _best_doc(store)
    assert not doc["significant"] and chosen.number == 0
    assert result.best is result.baseline and result.confirmation is None
    assert "best #0 (the baseline: no trial beats it outside the noise)" in out.getvalue()
    assert "nothing to confirm" in out.getvalue()
    assert [r.decision.source for r in store.trials("s")] == ["baseline", "scripted", "scripted"]


def test_the_strategys_diagnosis_is_stored_with_its_trial_and_shown(tmp_path):
    """mhc_gemm=bf16 behind round-trip casts (the case study): the GEMM gain is eaten by the casts.
    The agent's diagnose() runs before the trial is stored: it is in the result, the diagnoses table,
    the log and `autoopt show` (why chosen, predicted vs actual gain, the diagnosis)."""
    import json

    from autoopt.search.agent.strategy import AgentStrategy
    from cli_helpers import run_autoopt

    target = ReplayTarget(TABLE, seed=1)
    space = replay_space(target)
    agent = AgentStrategy(space, seed=1)
    scripted = _Scripted(space, [{"mhc_gemm": "bf16"}], parent=0, gain=0.08)
    agent.propose = scripted.propose  # the agent's own diagnosis, on a scripted pair of trials
    out = io.StringIO()
    loop, store = _loop(tmp_path, target=target, space=space, observer=LiveView(live=False, stream=out))
    loop.strategy = agent
    loop.run()
    t1 = store.trial("s", 1)
    diag = t1.result.diagnosis
    assert "casts ate 77% of the GEMM gain" in diag.verdict, diag
    assert diag.verdict.startswith("predicted +8.0% ± 4.0%, measured ") and diag.against == 0
    assert diag.predicted_gain == 0.08 and abs(diag.actual_gain) < 0.02
    assert t1.diagnoses[0]["verdict"] == diag.verdict and t1.diagnoses[0]["against_number"] == 0
    assert len(t1.diagnoses) == 1
    assert agent.diagnoses[1] == diag  # the agent keeps the loop's one diagnosis, not a second one
    assert f"trial #1 diagnosis: {diag.verdict}" in out.getvalue()
    assert store.trial("s", 0).diagnoses == []  # the baseline has nothing to be compared with
    store.close()

    shown = run_autoopt("show", "1", "--study", "s", "--db", str(tmp_path / "t.sqlite"), "--json")
    assert shown.returncode == 0, shown.stderr
    tr = json.loads(shown.stdout)["trial"]
    assert tr["diagnoses"][0]["verdict"] == diag.verdict and tr["extra"]["diagnosis"]["verdict"] == diag.verdict
    assert tr["predicted_gain"] == 0.08 and tr["actual_gain"] == diag.actual_gain
    assert tr["reason"] == "try {'mhc_gemm': 'bf16'}"
    text = run_autoopt("show", "1", "--study", "s", "--db", str(tmp_path / "t.sqlite"))
    assert text.returncode == 0, text.stderr
    flat = " ".join(text.stdout.split())
    assert "why chosen" in flat and "predicted gain" in flat and "actual gain" in flat
    assert "diagnosis: predicted +8.0%" in flat and "casts ate 77%" in flat


def test_a_continued_study_learns_measurement_costs_from_its_recorded_trials(tmp_path):
    """The resume path feeds the recorded trials to the one cost model: the casestudy table's sweeps
    take 120 s, not the 60 s default."""
    loop, store = _loop(tmp_path, "random", max_trials=3)
    assert loop.run().exit_code == 0
    store.close()
    again, _ = _loop(tmp_path, "random", max_trials=1, target=ReplayTarget(TABLE, seed=2))
    assert again.costs.measure_s() == 60.0  # nothing learned yet
    again.history, queue = resume.history_and_queue(again.store, again.space, again.settings.study_name, again.costs)
    # nothing interrupted: this run's own baseline only, profiled
    assert [(d.source, d.profile, d.rerun_of) for d in queue] == [("baseline", True, None)]
    assert len(again.history) >= 3 and again.costs.measure_s() == pytest.approx(120.0, rel=0.05)


def test_live_panel_shows_reason_diagnosis_and_stop(tmp_path):
    from rich.console import Console

    view = LiveView(live=False, stream=io.StringIO())
    loop, _ = _loop(tmp_path, "agent", max_trials=4, observer=view)
    result = loop.run()
    console = Console(file=io.StringIO(), width=400, record=True)
    console.print(view._render())
    text = console.export_text()
    assert "why    " in text and "diag   #" in text
    assert f"stop   {result.stop_reason}" in text
    assert f"best   #{result.best.number}" in text


def test_a_restart_paid_before_the_first_trial_leaves_its_measurement_seconds(tmp_path):
    """The builtin target starts its worker before trial 0 (to describe the device) and charges that
    start to trial 0 as its restart: the trial's cost must include it, so cost - transition is the
    measurement's seconds (the agent's cost model learns from it), not zero."""
    class PrePaid(ReplayTarget):
        def evaluate(self, request):
            m = super().evaluate(request)
            m.costs_s["restart"] = m.costs_s.get("restart", 0.0) + 500.0  # paid before t0
            return m

    target = PrePaid(TABLE, seed=1)
    loop, store = _loop(tmp_path, "agent", max_trials=2, target=target)
    loop.run()
    first = loop.trials[0]
    assert first.transition_s >= 500.0 and first.cost_s - first.transition_s == pytest.approx(120.0, rel=0.05)
    assert store.trial("s", 0).result.cost_s == pytest.approx(first.cost_s)
    assert loop.costs.measure_s() == pytest.approx(120.0, rel=0.05)


class _ThinkingStrategy:
    """A real strategy whose every proposal takes `think_s` on the budget's clock (the replay clock
    moves only when something advances it), as choosing and recording a trial do on a real one."""

    def __init__(self, inner, target, think_s: float) -> None:
        self.inner, self.target, self.think_s = inner, target, think_s

    def propose(self, ctx):
        self.target._clock_s += self.think_s
        return self.inner.propose(ctx)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_the_loops_own_seconds_and_overruns_are_budgeted_and_the_best_is_confirmed(tmp_path):
    """On the CPU's 2-minute run the loop spent 0.25 s a trial outside the measurement and trials of
    2.2 s expected took 1.9-3.3 s; budgeted without either, the last trial ate the confirmation's
    reserve ("no time left to confirm"). The loop learns its own seconds a trial and how far trials
    run over, and keeps both back. Here: the CPU grid's 0.3-0.7 s trials, a proposal of 0.3 s."""
    target = ReplayTarget(Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "tiny_cpu_grid.csv", seed=0)
    space = replay_space(target)
    store = Store.open(str(tmp_path / "t.sqlite"))
    budget = Budget(20.0, clock=target.now)
    run_id = store.start_run("s", "test", space.name, space.sha256, "replay", None, 0, {})
    strategy = _ThinkingStrategy(strategies.get("random", space, 0), target, think_s=0.3)
    loop = SearchLoop(store, target, space, strategy, budget,
                      LoopSettings(study_name="s", handle_sigint=False), run_id=run_id)
    result = loop.run()
    assert loop.costs.loop_s() == pytest.approx(0.3) and loop.costs.overrun() > 1
    assert len(result.trials) > 15
    assert result.confirmation is not None and store.trials("s")[-1].decision.source == "confirm"
    assert target.now() <= 20.0 + 1e-6
