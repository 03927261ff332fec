"""The agent end to end, through the real search loop on replay tables (simulated clock)."""
from __future__ import annotations

from pathlib import Path

import pytest

from autoopt.search import registry as strategies
from autoopt.search.agent.diagnosis import diagnose_trial
from autoopt.search.agent.strategy import AgentStrategy
from autoopt.search.bench import run_one
from autoopt.measurement import Measurement
from autoopt.search.cost import CostModel
from autoopt.search.strategy import Decision, SearchContext, TrialOutcome
from autoopt.trial import TrialResult
from autoopt.targets.base import EvalRequest
from autoopt.targets.replay.target import ReplayTarget, replay_space
from autoopt.targets.replay.table import load_table

FIX = Path(__file__).resolve().parent / "fixtures" / "replay"


@pytest.fixture(scope="module")
def case_table():
    return load_table(FIX / "casestudy.csv")


def test_registry_has_agent_as_default_and_grid():
    assert {"agent", "grid"} <= set(strategies.names())
    assert strategies.default_name() == "agent"
    space = replay_space(ReplayTarget(FIX / "casestudy.csv"))
    assert isinstance(strategies.get("agent", space, 0), AgentStrategy)


def test_agent_finds_the_case_study_optimum_and_stops_by_itself(case_table):
    budget = 4 * 3600.0
    runs = [run_one(case_table, "agent", seed, budget) for seed in range(8)]
    for r in runs:
        assert r.stop_reason.startswith("strategy stopped:") and r.stopped_early
        assert r.elapsed_s < 0.6 * budget  # nothing was worth the rest of the budget
        assert r.best_frac >= 0.95 and r.trials < 40
    # within 1% of the optimum in at least three runs of four (a 2-min sweep's noise of 1.5% can
    # hide the last +2.7% switch: such a run stops at 0.966, which the line above still bounds)
    assert sum(r.best_frac >= 0.99 for r in runs) >= 6


def test_agent_beats_random_search_on_the_case_study(case_table):
    agent = [run_one(case_table, "agent", s, 4 * 3600.0) for s in range(3)]
    rand = [run_one(case_table, "random", s, 4 * 3600.0) for s in range(3)]
    assert sum(r.best_frac for r in agent) > sum(r.best_frac for r in rand)
    assert sum(r.reach_s < 1e9 for r in agent) >= sum(r.reach_s < 1e9 for r in rand)


def result(space, m, cost_s, transition_s=0.0):
    obj = space.objective.value(m)
    return TrialResult(m.status, obj, space.objective.ci(m), cost_s=cost_s, transition_s=transition_s)


def _drive(table, seed: int, budget_s: float, **options):
    """The agent against a replay target without the loop (what the loop does for it here: the one
    cost model taught once per trial, the diagnosis made once): every decision it makes, in order."""
    target = ReplayTarget(table, seed=seed)
    space = replay_space(target)
    agent = AgentStrategy(space, seed=seed, **options)
    costs = CostModel(space)
    history: list[TrialOutcome] = []
    decisions = []
    built = None
    while True:
        ctx = SearchContext(space, target, list(history), budget_s - target.now(), 0.0, built, costs)
        d = agent.propose(ctx)
        if not isinstance(d, Decision):
            return agent, decisions, d, history
        decisions.append(d)
        config = space.params_to_config(d.params)
        estimate = costs.estimate(built, d.params, target.transition(config))
        t0 = target.now()
        m = target.evaluate(EvalRequest(config, tuple(space.concurrency), min_samples=10))
        out = TrialOutcome(len(history), d.params, m, result(
            space, m, target.now() - t0, sum(m.costs_s.get(k, 0.0) for k in ("restart", "build", "compile"))), d)
        out.result.diagnosis = agent.diagnose(out, history)
        costs.observe(built, d.params, out.result, estimate)
        built = dict(d.params) if out.result.ok else None
        history.append(out)
        agent.observe(out, SearchContext(space, target, list(history), budget_s - target.now(), 0.0, built, costs))


def test_every_decision_says_where_it_comes_from_what_it_expects_and_costs(case_table):
    agent, decisions, stop, history = _drive(case_table, 0, 4 * 3600.0)
    assert decisions[0].source == "baseline"
    search = [d for d in decisions if d.source not in ("baseline", "repeat")]
    assert search
    for d in search:
        assert d.source.split(":")[0] in ("sampler", "profile", "neighbour", "scan")
        assert d.reason and d.expected_gain is not None and d.expected_gain_sd is not None
        assert d.expected_cost_s and d.expected_cost_s > 0 and d.parent is not None
        assert "expected" in d.reason and ("measure" in d.reason)
    assert any(d.source.startswith("profile:") for d in search)
    assert stop.reason.endswith("< 1%/10min: stopping") or stop.reason.startswith("budget")
    assert all(n in agent.diagnoses for n in range(len(history)))


def test_min_gain_sets_when_the_agent_stops(case_table):
    _, eager, stop, _ = _drive(case_table, 1, 6 * 3600.0, min_gain="50%/10min")
    _, default, _, _ = _drive(case_table, 1, 6 * 3600.0)
    assert "< 50%/10min: stopping" in stop.reason and len(eager) < len(default)
    _, patient, stop2, _ = _drive(case_table, 1, 3 * 3600.0, min_gain="0")
    assert stop2.reason.startswith("budget") and len(patient) > 10


def test_a_gain_inside_the_noise_is_never_declared_a_win(tmp_path):
    """Every configuration is truly the same; 3% noise makes some measure several % better. The
    agent must keep the baseline as its best (max-of-measurements would not)."""
    rows = ["a,b,c,tok_per_s"] + [f"{a},{b},{c},100" for a in "xyz" for b in "pq" for c in (1, 2, 3)]
    (tmp_path / "flat.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "flat.restart.yaml").write_text("noise: 0.03\nmeasure_s: 60\nbaseline: {a: x, b: p, c: 1}\n")
    table = load_table(tmp_path / "flat.csv")
    kept, naive_moved = 0, 0
    for seed in range(5):
        agent, decisions, _, history = _drive(table, seed, 3 * 3600.0, min_gain="0")
        best = agent.best_params()
        kept += best == {"a": "x", "b": "p", "c": 1}
        top = max((t for t in history if t.objective), key=lambda t: t.objective)
        naive_moved += top.params != {"a": "x", "b": "p", "c": 1}
    assert kept >= 4 and naive_moved >= 4  # (over 12 seeds: 11 kept)


def test_a_real_small_gain_is_declared_after_interleaved_repeats(tmp_path):
    rows = ["a,b,c,tok_per_s"] + [f"{a},{b},{c},{104 if a == 'y' else 100}"
                                  for a in "xyz" for b in "pq" for c in (1, 2, 3)]
    (tmp_path / "small.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "small.restart.yaml").write_text("noise: 0.02\nmeasure_s: 60\nbaseline: {a: x, b: p, c: 1}\n")
    table = load_table(tmp_path / "small.csv")
    found, repeated, kinds = 0, 0, set()
    for seed in range(5):
        agent, decisions, _, _ = _drive(table, seed, 4 * 3600.0)
        found += agent.best_params()["a"] == "y"
        reps = [d for d in decisions if d.source == "repeat"]
        repeated += bool(reps)
        assert all("inside the noise" in d.reason for d in reps)
        if reps:
            assert reps[0].notes["repeat_of"] == "challenger"  # its first, selecting look does not count
        kinds |= {d.notes["repeat_of"] for d in reps}
    assert found >= 4 and repeated >= 3 and kinds == {"challenger", "incumbent"}  # interleaved


def test_diagnosis_names_the_casts_that_ate_the_gain():
    target = ReplayTarget(FIX / "casestudy.csv")
    space = replay_space(target)
    base = space.baseline_params()
    flip = {**base, "mhc_gemm": "bf16"}

    def outcome(n, params, pred=None):
        m = target.evaluate(EvalRequest(space.params_to_config(params), (64,)))
        d = Decision(params, "profile:gemm_simt", "x", expected_gain=pred, expected_gain_sd=0.03, parent=0)
        return TrialOutcome(n, params, m, result(space, m, 1.0), d)

    parent, child = outcome(0, base), outcome(1, flip, pred=0.08)
    diag = diagnose_trial(child, parent)
    assert diag.parent == 0 and diag.predicted_gain == 0.08 and abs(diag.actual_gain) < 0.05
    assert "predicted +8.0% ± 3.0%" in diag.line and "casts ate" in diag.line
    assert "copy_cast +46.0 ms" in diag.line and "worse than expected" in diag.line
    assert "host-bound" not in diag.line  # the replay's profiles cover the whole step
    parent.measurement.bucket_coverage, child.measurement.bucket_coverage = 0.08, 0.09
    assert "host-bound: the profiled work covers 8% -> 9% of the step's wall time" in \
        diagnose_trial(child, parent).line
    crash = Measurement.failed({}, "crash", "segfault")
    failed = TrialOutcome(2, flip, crash, result(space, crash, 1.0), Decision(flip, "neighbour", "x", expected_gain=0.01))
    assert diagnose_trial(failed, parent).line.startswith("failed (crash: segfault)")


def test_diagnosis_says_which_side_has_no_profile():
    """A confirmation re-measures without profiling: its line names the unprofiled trial, not
    "no profile on both sides" when its parent had one (the live H100 run's last line)."""
    target = ReplayTarget(FIX / "casestudy.csv")
    space = replay_space(target)
    base = space.baseline_params()

    def outcome(n, source, profiled):
        m = target.evaluate(EvalRequest(space.params_to_config(base), (64,)))
        if not profiled:
            m.buckets_ms = {}
        return TrialOutcome(n, base, m, result(space, m, 1.0), Decision(base, source, "x", parent=0))

    parent = outcome(0, "profile:gemm_simt", profiled=True)
    confirm = diagnose_trial(outcome(7, "confirm", profiled=False), parent).line
    assert confirm.endswith("no bucket diff: #7 not profiled (a confirmation re-measures, it does not profile)")
    neither = diagnose_trial(outcome(8, "neighbour", profiled=False), outcome(0, "baseline", profiled=False)).line
    assert neither.endswith("no bucket diff: #0 and #8 not profiled")


def test_grid_visits_every_valid_point_once_dearest_knobs_slowest():
    table = load_table(FIX / "casestudy.csv")
    target = ReplayTarget(table)
    space = replay_space(target)
    grid = strategies.get("grid", space, 0)
    history: list[TrialOutcome] = []
    seen = []
    for _ in range(40):
        d = grid.propose(SearchContext(space, target, list(history), 1e9, 0.0, None, CostModel(space)))
        seen.append(d.params)
        excluded = Measurement.failed({}, "excluded", "x")
        history.append(TrialOutcome(len(history), d.params, excluded, result(space, excluded, 0.0), d))
    assert seen[0] == space.baseline_params()
    keys = [tuple(sorted(p.items())) for p in seen]
    assert len(set(keys)) == len(keys)
    # cuda_graphs (a restart) never changes within the first 40 points; runtime knobs change fastest
    assert len({p["cuda_graphs"] for p in seen[1:]}) == 1
    assert len({p["moe_experts"] for p in seen[1:3]}) == 2
