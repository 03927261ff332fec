"""The one cost model (autoopt.search.cost): which knobs change, the dearest restart class, learned
apply seconds, cached kernels, the target's known figure corrected by experience, fresh starts — and
its prediction stored with the trial and shown next to what the transition really took."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoopt.search.cost import CostModel
from autoopt.targets.base import EvalRequest, Transition
from autoopt.targets.replay.target import ReplayTarget, replay_space
from autoopt.trial import TrialResult

CASE = Path(__file__).resolve().parent / "fixtures" / "replay" / "casestudy.csv"


@pytest.fixture(scope="module")
def space():
    return replay_space(ReplayTarget(CASE))


def params(space, **changes):
    return {**space.baseline_params(), **changes}


def took(transition_s, measure_s, ok=True):
    return TrialResult("ok" if ok else "failed", 1.0 if ok else None, cost_s=transition_s + measure_s,
                       transition_s=transition_s)


def test_priors_from_the_space_and_the_dearest_class(space):
    cm = CostModel(space, default_measure_s=120)
    base = space.baseline_params()
    e = cm.estimate(base, params(space, moe_experts="grouped"))
    assert e.transition_s == 0 and e.restart_class == "none" and e.total_s == 120
    e = cm.estimate(base, params(space, moe_experts="grouped", attention="mma", cuda_graphs="on"))
    assert e.restart_class == "restart" and e.transition_s == 300  # the space prior of cuda_graphs
    assert set(e.changed) == {"moe_experts", "attention", "cuda_graphs"}
    assert "restart 5m00s + measure 2m00s" in e.text()
    assert cm.estimate(None, base).restart_class == "restart"  # nothing running: a fresh start
    assert cm.fresh_start_s() == 300


def test_learns_apply_seconds_per_knob_and_measurement_seconds(space):
    cm = CostModel(space)
    base = space.baseline_params()
    glue = params(space, glue="compile")
    cm.observe(base, glue, took(150.0, 100.0))
    cm.observe(glue, base, took(170.0, 140.0))
    assert cm.measure_s() == pytest.approx(120.0)
    assert cm.estimate(base, glue).transition_s == pytest.approx(160.0)  # learned median beats the prior
    # a change of two knobs with cached kernels is attributed to the dearer one, as a warm switch
    both = params(space, glue="compile", cuda_graphs="on")
    cm.observe(base, both, took(400.0, 120.0), cm.estimate(base, both, Transition("restart", (), cached=True)))
    graphs = params(space, cuda_graphs="on")
    assert cm.estimate(base, graphs, Transition("restart", (), cached=True)).transition_s == pytest.approx(400.0)
    assert cm.estimate(base, graphs).transition_s == pytest.approx(300.0)  # cold: still the prior
    cm.observe(base, glue, took(999.0, 5.0, ok=False))  # a failure's transition teaches, its measurement not
    assert cm.measure_s() == pytest.approx(120.0) and cm.dearest_seen_s == 400.0


def test_cold_and_warm_compiles_are_learned_apart_per_knob(space):
    """A recompile whose kernels this worker compiled before skips the compile; a fresh worker
    (nothing built) compiles again. Learned per knob; a knob never switched warm borrows the
    warm/cold ratio the others showed."""
    cm = CostModel(space)
    base, att = space.baseline_params(), params(space, attention="mma")
    cold, warm = Transition("recompile", ("attention",)), Transition("recompile", ("attention",), cached=True)
    for seconds in (60.0, 64.0):
        cm.observe(base, att, took(seconds, 30.0), cm.estimate(base, att, cold))
    for seconds in (6.0, 6.4):
        cm.observe(att, base, took(seconds, 30.0), cm.estimate(att, base, warm))
    assert cm.estimate(base, att, cold).transition_s == pytest.approx(62.0)
    assert cm.estimate(base, att, warm).transition_s == pytest.approx(6.2)
    assert cm.estimate(base, att, warm).cached and not cm.estimate(base, att, cold).cached
    assert cm.warm_fraction() == pytest.approx(0.1)
    blk = params(space, attn_block_kv=128)  # cold: the space's prior for its class; warm: a tenth of it
    cold_blk = cm.estimate(base, blk, Transition("recompile", ("attn_block_kv",))).transition_s
    warm_blk = cm.estimate(base, blk, Transition("recompile", ("attn_block_kv",), cached=True)).transition_s
    assert cold_blk > 0 and warm_blk == pytest.approx(0.1 * cold_blk)
    # a fresh worker has nothing cached, whatever the target says: a fresh start, cold
    fresh = cm.estimate(None, att, warm)
    assert not fresh.cached and fresh.restart_class == "restart" and fresh.transition_s >= 62.0


def test_the_targets_known_figure_is_scaled_by_how_wrong_it_was(space):
    cm = CostModel(space)
    base, att = space.baseline_params(), params(space, attention="mma")
    known = Transition("recompile", ("attention",), known_s=40.0)
    first = cm.estimate(base, att, known)
    assert first.transition_s == pytest.approx(40.0) and first.known_s == 40.0
    cm.observe(base, att, took(80.0, 60.0), first)
    # the target's recompile figures were 2x too low: its next one is doubled
    blk = params(space, attn_block_kv=128)
    assert cm.estimate(base, blk, Transition("recompile", ("attn_block_kv",), known_s=30.0)).transition_s == \
        pytest.approx(60.0)


def test_no_change_is_free_and_cached_is_reported(space):
    cm = CostModel(space)
    att = params(space, attention="mma")
    cached = Transition("none", (), cached=True, known_s=0.0)
    assert cm.estimate(att, att, cached).transition_s == 0.0
    assert cm.estimate(space.baseline_params(), att, cached).cached


def test_the_prediction_is_stored_with_the_trial_and_shown_next_to_the_actual(tmp_path):
    """One estimate per trial: the loop's budget check, the stored expected cost and `autoopt show`
    all read the same figure, and show prints it beside the transition the trial really took."""
    from cli_helpers import run_autoopt

    db = tmp_path / "t.sqlite"
    run = run_autoopt("run", "--target", f"replay:{CASE}", "--budget", "2h", "--max-trials", "4",
                      "--strategy", "agent", "--seed", "1", "--db", str(db), "--json", "--no-confirm")
    assert run.returncode == 0, run.stderr
    from autoopt.store import Store

    with Store.open(str(db), create=False) as store:
        study = store.studies()[0]
        rows = store.trials(study)
    assert len(rows) >= 3
    for r in rows:
        cost = r.decision.expected_cost
        assert cost is not None and r.decision.expected_cost_s == pytest.approx(cost.total_s)
        assert cost.known_s is not None  # the replay table's figure, a fact the target reported
    # the replay table's figures are exact: predicted == actual for a switch it knows (a trial that
    # fails also pays the time it takes to fail, which no transition fact tells)
    second = next(r for r in rows[1:] if r.result.ok)
    assert second.decision.expected_cost.transition_s == pytest.approx(second.result.transition_s)
    shown = run_autoopt("show", str(second.number), "--study", study, "--db", str(db), "--json")
    assert shown.returncode == 0, shown.stderr
    tr = json.loads(shown.stdout)["trial"]["transition"]
    assert tr["predicted_s"] == pytest.approx(second.decision.expected_cost.transition_s)
    assert tr["actual_s"] == pytest.approx(second.result.transition_s)
    assert tr["restart_class"] == second.result.restart_class
    text = run_autoopt("show", str(second.number), "--study", study, "--db", str(db))
    assert text.returncode == 0, text.stderr
    flat = " ".join(text.stdout.split())
    assert "transition predicted" in flat and "actual" in flat


def test_a_worker_that_survived_a_failure_is_not_a_fresh_start_once_seen(space):
    """After a failure the loop trusts nothing built; the builtin target says its worker lives on and
    has built before ("rebuild", cached), lives on fresh ("rebuild"), or died ("restart"). A worker
    with warm caches is learned from such trials (only successful ones: a failure's seconds are not
    a switch); the others stay a fresh start."""
    cm = CostModel(space)
    base = space.baseline_params()
    warm = Transition("rebuild", ("attention",), cached=True)
    fresh, dead = Transition("rebuild", ("attention",)), Transition("restart", ("attention",))
    fresh_s = cm.fresh_start_s()
    first = cm.estimate(None, base, warm)  # before any: the dearest knob's warm (cached) switch
    assert first.restart_class == "rebuild" and first.cached
    assert first.transition_s == pytest.approx(fresh_s * cm.warm_fraction())
    cm.observe(None, base, took(0.0, 0.0, ok=False), first)  # it failed: teaches nothing
    assert cm.relaunch_obs == []
    cm.observe(None, base, took(4.0, 20.0), cm.estimate(None, base, warm))
    assert cm.estimate(None, base, warm).transition_s == pytest.approx(4.0)
    for other in (fresh, dead):  # a worker that never built, or a new one: a fresh start
        e = cm.estimate(None, base, other)
        assert e.transition_s == pytest.approx(cm.start_s()) and not e.cached
    cm.observe(None, base, took(90.0, 20.0), cm.estimate(None, base, fresh))  # not a warm relaunch
    assert cm.relaunch_obs == [4.0]


def test_a_fresh_start_costs_the_start_plus_what_it_builds_beyond_the_baseline(space):
    """Not the space's dearest knob: the baseline only pays the start (on the live H200 the first
    trial was predicted at the step compile's 150 s and took 15-19 s); a configuration that sets a
    compiled knob away from the baseline pays that compile on top; a restart-class knob's own
    restart is the start itself, not a second one. The start is learned from fresh baselines."""
    cm = CostModel(space)
    base = space.baseline_params()
    start = cm.start_s()
    assert start == pytest.approx((space.apply_cost_s or {}).get("restart", 0.0))
    assert start < cm.fresh_start_s()  # the space's dearest knob, the failure penalty
    assert cm.estimate(None, base).transition_s == pytest.approx(start)
    glue = params(space, glue="compile")  # a rebuild-class knob inside the started worker
    assert cm.estimate(None, glue).transition_s == pytest.approx(start + cm.estimate(base, glue).transition_s)
    graphs = params(space, cuda_graphs="on")  # restart class: its switch is a whole start
    assert cm.estimate(None, graphs).transition_s == pytest.approx(
        max(start, cm.estimate(base, graphs).transition_s))
    cm.observe(None, base, took(17.0, 5.0), cm.estimate(None, base))
    cm.observe(None, glue, took(500.0, 5.0), cm.estimate(None, glue))  # built more: not a start
    assert cm.start_obs == [17.0] and cm.estimate(None, base).transition_s == pytest.approx(17.0)


def test_work_a_switch_redoes_is_charged_and_learned_apart(space):
    """A runtime switch under a compiled step re-traces it (`redone`): not free, yet not the cold
    compile (the worker compiled it before: its warm switch, then what re-traces took); what the
    re-trace took is not the runtime knob's own seconds. Without the redo the same switch stays free."""
    cm = CostModel(space)
    glue = params(space, glue="compile")
    moved = {**glue, "moe_experts": "grouped"}
    plain = cm.estimate(glue, moved)
    assert plain.transition_s == 0 and plain.redone == ()
    retrace = Transition("rebuild", ("moe_experts",), redone=("glue",))
    first = cm.estimate(glue, moved, retrace)
    base = space.baseline_params()
    warm_glue = cm.estimate(base, glue, Transition("recompile", ("glue",), cached=True)).transition_s
    assert 0 < warm_glue < cm.estimate(base, glue).transition_s  # redone in a worker that built it: warm
    assert first.redone == ("glue",) and first.transition_s == pytest.approx(warm_glue)
    assert first.restart_class == "recompile" and first.changed == ("moe_experts",)  # glue's class
    cm.observe(glue, moved, took(8.0, 5.0), first)
    cm.observe(moved, glue, took(12.0, 5.0), cm.estimate(moved, glue, retrace))
    assert cm.estimate(glue, moved, retrace).transition_s == pytest.approx(10.0)
    assert cm.estimate(glue, moved).transition_s == 0  # the runtime knob learned nothing from it
    assert cm.estimate(glue, glue, retrace).transition_s == 0  # nothing changes: nothing redone
    # a re-trace whose kernels were all compiled before is learned apart from one that compiles anew
    # (0.5-0.8 s against 8-12 s on the H200: h200_live_10m_run5); until seen, it borrows the cold one
    # scaled as cached switches are (warm_fraction)
    hit = Transition("rebuild", ("moe_experts",), cached=True, redone=("glue",))
    assert cm.estimate(glue, moved, hit).transition_s == pytest.approx(10.0 * cm.warm_fraction())
    cm.observe(glue, moved, took(0.6, 5.0), cm.estimate(glue, moved, hit))
    assert cm.estimate(glue, moved, hit).transition_s == pytest.approx(0.6)
    assert cm.estimate(glue, moved, retrace).transition_s == pytest.approx(10.0)


def test_a_knob_prior_of_zero_is_no_claim_and_yields_to_the_class_seconds_measured():
    # tiles.csv's restart file gives every knob 0 s (its table holds the compile seconds); read as a
    # claim, every untried tile switch was predicted free, and the agent's median time to within 1 %
    # on tiles.csv rose from 6 min to 33 min
    space = replay_space(ReplayTarget(CASE.parent / "tiles.csv"))
    cm = CostModel(space)
    base = space.baseline_params()
    warps = {**base, "num_warps": 8}
    cm.observe(base, warps, took(25.0, 20.0))
    assert cm.estimate(warps, {**warps, "num_stages": 3}).transition_s == pytest.approx(25.0)


def test_the_confirmation_reserve_is_the_way_back_to_the_best_not_the_dearest_switch_seen(space):
    """On the H200 the reserve was the dearest transition seen (a 1 min 30 s step compile) while going
    back to the best took 4-5 s: both runs stopped with over a minute unused. The reserve is the way
    back from the build now, or one warm switch back after the next trial, whichever is dearer."""
    cm = CostModel(space)
    base, glue, graphs = space.baseline_params(), params(space, glue="compile"), params(space, cuda_graphs="on")
    cold, warm = Transition("recompile", ("glue",)), Transition("recompile", ("glue",), cached=True)
    cm.observe(base, glue, took(150.0, 10.0), cm.estimate(base, glue, cold))
    cm.observe(glue, base, took(6.0, 10.0), cm.estimate(glue, base, warm))
    cm.observe(base, graphs, took(20.0, 10.0), cm.estimate(base, graphs, Transition("restart", ("cuda_graphs",))))
    assert cm.dearest_seen_s == 150.0
    assert cm.confirm_reserve_s() == pytest.approx(10.0 + 150.0)  # nothing to go back to yet
    # sitting on the best: the next trial's way back is a warm switch, or the 20 s restart it may cause
    assert cm.return_bound_s() == pytest.approx(20.0)
    assert cm.confirm_reserve_s(glue, glue) == pytest.approx(10.0 + 20.0)
    assert cm.confirm_reserve_s(base, glue, warm) == pytest.approx(10.0 + 20.0)
    # a worker that never compiled the best's glue must compile it cold to go back
    assert cm.confirm_reserve_s(base, glue, cold) == pytest.approx(10.0 + 150.0)


def test_a_table_prices_its_own_fresh_start_after_an_invalid_row(tmp_path):
    """A recorded table knows what starting a configuration costs (its restart seconds and the row's
    compile), and its fresh starts never teach `start_obs`: after an invalid row the estimate is the
    table's figure, not the space's restart prior (on `dedispersion_A100` every candidate after a
    failure was predicted at 30 s, took 0.5 s, and the agent stopped itself on the 30 s)."""
    path = tmp_path / "kt.csv"
    path.write_text("a,b,time,compile_s\n1,1,10,0.2\n1,2,9,0.2\n2,1,8,0.3\n")  # (2, 2) absent: invalid
    target = ReplayTarget(path, measure_s=2.0)
    space = replay_space(target)
    cm = CostModel(space)
    base = space.baseline_params()
    target.evaluate(EvalRequest(config=dict(base), concurrency=(1,), min_samples=3))
    one = params(space, b=2)
    before = target.now()
    facts = target.transition(one)
    cm.observe(base, one, took(facts.known_s, 2.0), cm.estimate(base, one, facts))
    target.evaluate(EvalRequest(config=dict(one), concurrency=(1,), min_samples=3))
    assert target.now() - before == pytest.approx(0.2 + 2.0)  # the switch compiles the row: 0.2 s
    failed = target.evaluate(EvalRequest(config={"a": 2, "b": 2}, concurrency=(1,), min_samples=3))
    assert failed.status == "failed"  # nothing runs now: the next trial is a fresh start
    other = params(space, a=2)
    facts = target.transition(other)
    assert facts.known_s == pytest.approx(0.3) and cm.start_s() >= 10 * facts.known_s  # the prior would be far off
    estimate = cm.estimate(None, other, facts)
    assert estimate.transition_s == pytest.approx(0.3)
    before = target.now()
    target.evaluate(EvalRequest(config=dict(other), concurrency=(1,), min_samples=3))
    assert target.now() - before == pytest.approx(estimate.transition_s + 2.0)


def test_a_knobs_own_prior_follows_this_machines_pace_read_off_its_worker_starts():
    """The space's seconds were written on one machine: on an H100 whose worker started in 5.8 s
    against the restart prior's 20 s, the first step compile took 48 s against its own prior of
    150 s (benchmarks/results/h100_live_10m). Once a start is measured, an untried knob's own prior
    is scaled by start measured / start prior; a class default and a measured knob are not."""
    from autoopt.targets.declared import load_declared

    space = load_declared("dsv4_flash_decode")
    cm = CostModel(space)
    base = space.baseline_params()
    compiled = {**base, "step_compile": "inductor"}
    assert cm.pace() == 1.0 and cm.estimate(base, compiled).transition_s == pytest.approx(150.0)
    cm.observe(None, base, took(5.0, 3.0), cm.estimate(None, base))  # a fresh baseline: the start
    assert cm.pace() == pytest.approx(5.0 / 20.0)
    assert cm.estimate(base, compiled).transition_s == pytest.approx(150.0 * 5.0 / 20.0)
    tile = next(p.name for p in cm.params if not p.own_prior and p.restart_class.value == "recompile")
    moved = {**base, tile: next(v for v in space.param_by_name[tile].choices if v != base[tile])}
    assert cm.estimate(base, moved).transition_s == pytest.approx(10.0)  # the class default, unscaled
    cm.observe(base, compiled, took(60.0, 3.0))  # measured: the measurement, not the scaled prior
    assert cm.estimate(base, compiled).transition_s == pytest.approx(60.0)


def test_a_rebuild_redone_before_its_first_is_its_cold_switch_a_recompile_its_warm_one():
    """A redo of a rebuild-class knob (a new CUDA graph capture) repeats the capture, which no kernel
    cache shortens: before the first is seen it costs what switching the knob on cost, not a warm
    fraction of it (on the H200 the first re-capture was predicted at 0.4 s and took 1.1-1.4 s, in
    five studies, benchmarks/cost_replay.py). A recompile-class redo (a re-trace) stays a warm switch."""
    from autoopt.targets.declared import load_declared

    space = load_declared("dsv4_flash_decode")
    cm = CostModel(space)
    base = space.baseline_params()
    graphs = {**base, "cuda_graphs": "on"}
    cm.observe(base, graphs, took(2.3, 3.0), cm.estimate(base, graphs))  # the capture, cold
    moved = {**graphs, "moe_experts@window": "grouped"}
    recapture = Transition("rebuild", ("moe_experts",), redone=("cuda_graphs",))
    assert cm.estimate(graphs, moved, recapture).transition_s == pytest.approx(2.3)
    compiled = {**base, "step_compile": "inductor"}
    cm.observe(base, compiled, took(100.0, 3.0), cm.estimate(base, compiled))
    retrace = Transition("rebuild", ("moe_experts",), redone=("step_compile",))
    assert cm.estimate(compiled, {**compiled, "moe_experts@window": "grouped"}, retrace).transition_s \
        == pytest.approx(100.0 * cm.warm_fraction())


def test_a_live_worker_not_warm_for_a_compiled_step_pays_a_retrace_not_a_start(space):
    """After a failure its worker survived, a configuration with a kernel new to it re-traces a step
    the worker compiled before (the target names the redo): no start and no first step compile (on
    the H200 5-36 s, priced at a fresh start's 120-151 s: h200_live_10m_run3 run 2)."""
    cm = CostModel(space)
    sc = params(space, glue="compile")  # this space's compiled step
    moved = {**sc, "moe_experts": "grouped"}
    retrace = Transition("rebuild", ("moe_experts",), redone=("glue",))
    for seconds in (12.0, 14.0):
        cm.observe(sc, moved, took(seconds, 5.0), cm.estimate(sc, moved, retrace))
    relaunch = Transition("rebuild", tuple(p.knob for p in cm.params), redone=("glue",))
    est = cm.estimate(None, moved, relaunch)
    assert est.transition_s == pytest.approx(13.0) and est.restart_class == "rebuild"
    fresh = cm.estimate(None, moved, Transition("rebuild", ()))  # nothing redone: a fresh start, cold
    assert fresh.restart_class == "restart" and fresh.transition_s >= 60.0
