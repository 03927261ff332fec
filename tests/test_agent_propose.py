"""Candidates (sampler on an in-memory mirror, profile moves, cheap neighbours) and how they are
chosen (expected gain per second, failure odds, batched builds)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from autoopt.agent.buckets import BucketModel
from autoopt.agent.choose import Chooser
from autoopt.agent.cost import CostModel
from autoopt.agent.failure import FailureModel
from autoopt.agent.model import GainModel
from autoopt.agent.propose import Candidate, Proposer, SamplerMirror
from autoopt.agent.view import SpaceView
from autoopt.targets.replay import ReplayTarget, replay_space

CASE = Path(__file__).resolve().parent / "fixtures" / "replay" / "casestudy.csv"


@pytest.fixture(scope="module")
def case():
    t = ReplayTarget(CASE)
    return t, SpaceView(replay_space(t))


def code(view, **changes):
    c = view.base_code.copy()
    for name, value in changes.items():
        i = view.names.index(name)
        c[i] = list(view.params[i].choices).index(value)
    return c


def measured(target, view, codes):
    out = []
    for c in codes:
        r = target.table.rows[target.table.key(view.decode(c))]
        out.append((c, None if r.value is None else math.log(r.value / 56.95), r))
    return out


def test_sampler_mirror_holds_only_evaluated_trials(case):
    target, view = case
    trials = [(c, y) for c, y, _ in measured(target, view, [view.base_code, code(view, attention="mma")])]
    trials.append((code(view, indexer_gemm="fp8", glue="compile", attn_block_kv=32), None))  # a failure
    mirror = SamplerMirror(view, "tpe", seed=0)
    mirror.sync(trials)
    asked = mirror.ask(5)
    assert len(asked) == 5 and all(view.encode(view.decode(c)) is not None for c in asked)
    states = [t.state.name for t in mirror._study.get_trials(deepcopy=False)]
    assert states.count("COMPLETE") == 2 and states.count("FAIL") == 1 + 5  # asks never complete
    first = mirror._study
    mirror.sync(trials + [(code(view, moe_experts="grouped"), 0.05)])
    assert mirror._study is first  # extended in place
    mirror.sync(trials[:1])
    assert mirror._study is not first  # not an extension: rebuilt from the history


def test_unknown_sampler_is_refused(case):
    with pytest.raises(ValueError):
        SamplerMirror(case[1], "cma")


def test_candidates_come_from_all_three_sources(case):
    target, view = case
    bm = BucketModel(view)
    base_row = target.table.rows[target.table.key(view.decode(view.base_code))]
    bm.add(view.base_code, base_row.buckets_ms, is_baseline=True)
    prop = Proposer(view, seed=1)
    trials = [(view.base_code, 0.0)]
    cands = prop.candidates(trials, view.base_code, base_row.buckets_ms, view.base_code, [], bm,
                            skip={tuple(view.base_code)})
    sources = {c.source.split(":")[0] for c in cands}
    assert sources == {"profile", "neighbour", "sampler", "scan"}
    profile = [c for c in cands if c.source.startswith("profile:")]
    att = [c for c in profile if view.describe(c.code) == "attention=mma"]
    assert att and att[0].source == "profile:attention" and "Amdahl +" in att[0].note  # 23% of the step
    keys = [tuple(c.code) for c in cands]
    assert tuple(view.base_code) not in keys and len(keys) == len(set(keys))
    build = [c for c in cands if c.source == "neighbour:build"]
    assert build and all(view.build_key(c.code) == view.build_key(view.base_code) for c in build)


def test_constraints_of_the_space_are_respected():
    from autoopt.space import SearchSpace

    space = SearchSpace.load("dsv4_tiny_cpu")
    view = SpaceView(space)
    prop = Proposer(view, seed=0)
    cands = prop.candidates([(view.base_code, 0.0)], view.base_code, {}, view.base_code, [],
                            BucketModel(view), skip=set())
    assert cands and all(space.is_feasible(view.decode(c.code)) for c in cands)


def _chooser(view, target):
    gp = GainModel(view)
    costs = CostModel(view, default_measure_s=120)
    return Chooser(view, gp, costs, FailureModel(view)), gp


def test_equal_gain_the_cheaper_candidate_wins(case):
    target, view = case
    ch, gp = _chooser(view, target)
    gp.fit(view.base_code[None, :], np.zeros(1), np.full(1, 0.01))
    runtime = Candidate(code(view, moe_experts="grouped"), "neighbour")
    restart = Candidate(code(view, cuda_graphs="on"), "neighbour")
    ranked = ch.rank([restart, runtime], view.base_code, 0.0, view.base_code, lambda c: None, set())
    assert ranked[0].cand is runtime and ranked[0].worth == pytest.approx(ranked[1].worth, rel=1e-6)
    assert ranked[0].rate > 2 * ranked[1].rate


def test_failure_odds_discount_a_candidate(case):
    target, view = case
    ch, gp = _chooser(view, target)
    gp.fit(view.base_code[None, :], np.zeros(1), np.full(1, 0.01))
    bad = code(view, indexer_gemm="fp8", cuda_graphs="on")
    for extra in ({}, {"moe_experts": "grouped"}, {"glue": "compile"}):
        ch.failures.add(code(view, indexer_gemm="fp8", cuda_graphs="on", **extra), failed=True)
    for good in ({"attention": "mma"}, {"glue": "compile"}, {"moe_experts": "grouped"}):
        ch.failures.add(code(view, **good), failed=False)
    ok = code(view, indexer_gemm="bf16", cuda_graphs="on")
    ranked = {tuple(s.code): s for s in ch.rank([Candidate(bad, "n"), Candidate(ok, "n")], view.base_code,
                                                0.0, view.base_code, lambda c: None, set())}
    assert ranked[tuple(bad)].p_fail > 0.5 > ranked[tuple(ok)].p_fail
    assert ranked[tuple(bad)].rate < ranked[tuple(ok)].rate


def test_a_build_is_worth_more_with_cheap_runtime_variants_to_try_in_it(case):
    target, view = case
    ch, gp = _chooser(view, target)
    gp.fit(view.base_code[None, :], np.zeros(1), np.full(1, 0.01))
    opening = Candidate(code(view, cuda_graphs="on"), "neighbour")
    ranked = ch.rank([opening], view.base_code, 0.0, view.base_code, lambda c: None, set())
    alone = ranked[0].worth / ranked[0].cost.total_s
    assert ranked[0].batch >= 1 and ranked[0].rate > alone
