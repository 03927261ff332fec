"""The agent's uncertainty says what it has not seen, is measured online, and licenses the stop."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autoopt.search.agent.calibration import MIN_SCORED, Calibration
from autoopt.search.agent.model import GainModel
from autoopt.search.agent.strategy import AgentStrategy
from autoopt.search.agent.view import SpaceView
from autoopt.search.agent.choose import Scored
from autoopt.search.agent.propose import Candidate
from autoopt.search.cost import CostModel
from autoopt.search.strategy import SearchContext
from autoopt.trial import CostEstimate
from autoopt.targets.replay.target import ReplayTarget, replay_space

FIX = Path(__file__).resolve().parent / "fixtures" / "replay"
BUDGET_S = 4 * 3600.0


@pytest.fixture(scope="module")
def tiles_view():
    return SpaceView(replay_space(ReplayTarget(FIX / "tiles.csv")))


def _code(view, base=None, **changes):
    c = (view.base_code if base is None else base).copy()
    for name, value in changes.items():
        i = view.names.index(name)
        c[i] = list(view.params[i].choices).index(value)
    return c


def test_an_untried_value_and_an_untried_context_stay_uncertain(tiles_view):
    view = tiles_view
    # every value of every knob tried once from the baseline, except num_warps=8; additive truth
    rows = [view.base_code]
    for p, param in enumerate(view.params):
        for v in range(len(param.choices)):
            if v != param.base and not (param.name == "num_warps" and param.choices[v] == 8):
                c = view.base_code.copy()
                c[p] = v
                rows.append(c)
    X = np.stack(rows)
    y = 0.05 * (X - view.base_code[None, :]).sum(axis=1)
    gp = GainModel(view)
    gp.fit(X, y, np.full(len(X), 0.005))
    _, sd_seen = gp.predict(_code(view, num_warps=2)[None, :])
    _, sd_untried = gp.predict(_code(view, num_warps=8)[None, :])
    assert sd_untried[0] > 3 * sd_seen[0]  # a value never measured: its prior's width, not the data's
    # a knob tried only from the baseline, now in the context of two other changes: the pair terms
    # it was never measured with keep it more uncertain than where it was measured
    ctx = _code(view, block_kv=128, split_k=4)
    _, sd_ctx = gp.predict(_code(view, ctx, num_warps=2)[None, :])
    assert sd_ctx[0] > sd_seen[0]


def test_calibration_widens_an_overconfident_model_and_counts_the_misses():
    cal = Calibration()
    rng = np.random.default_rng(0)
    for _ in range(30):  # the model says sd 0.01; misses are ten times that
        cal.add(0.0, 0.01, float(rng.normal(0, 0.1)))
    assert cal.inside_share() < 0.5 and not cal.calibrated()
    assert 5.0 < cal.scale() < 20.0  # what it would take to cover the recent misses
    widened = cal.scale()
    for _ in range(30):  # predictions made with the widened sd are honest: calibrated again
        cal.add(0.0, 0.01 * widened, float(rng.normal(0, 0.1)), scale_then=widened)
    assert cal.calibrated() and abs(cal.scale() - widened) < 0.5 * widened
    fresh = Calibration()
    for _ in range(MIN_SCORED - 1):
        fresh.add(0.0, 1.0, 0.0)
    assert not fresh.calibrated()  # too few predictions scored: no licence yet


def test_the_stop_rule_does_not_fire_on_an_uncalibrated_model(tiles_view):
    """The stop rule found nothing worth its cost. On an uncalibrated model (too few predictions
    scored, or too many missed) that verdict is not evidence: a cheap, plausible candidate is tried
    instead; a calibrated one stops. Nothing cheap and plausible (every candidate near-certain to
    fail): it stops, and says the model was not calibrated."""
    space = tiles_view.space
    agent = AgentStrategy(space, seed=0)
    view = agent.view
    costs = CostModel(space)
    ctx = SearchContext(space, None, [], 3600.0, 60.0, None, costs)
    cheap = CostEstimate(30.0, 20.0, "recompile")
    maybe = Scored(Candidate(_code(view, num_warps=8), "scan"), "num_warps=8", gain=-0.05, gain_sd=0.1,
                   worth=0.001, p_fail=0.1, cost=cheap, rate=1e-7, mu=-0.05)
    doomed = Scored(Candidate(_code(view, split_k=8), "scan"), "split_k=8", gain=-0.05, gain_sd=0.1,
                    worth=0.001, p_fail=0.99, cost=cheap, rate=1e-9, mu=-0.05)
    why = "best candidate ... < 1%/10min: stopping"
    inc = view.base_code
    for z in (3.0, -4.0, 5.0) * 5:  # the last 15 predictions missed by 3-5 sd
        agent.calibration.add(0.0, 1.0, z)
    assert not agent.calibration.calibrated()
    pick, reason = agent._before_stopping(ctx, inc, 0.0, inc, [maybe, doomed], why)
    assert pick is maybe
    pick, reason = agent._before_stopping(ctx, inc, 0.0, inc, [doomed], why)
    assert pick is None and "not enough to trust it" in reason and reason.endswith(why)
    for _ in range(20):  # now the model's intervals held
        agent.calibration.add(0.0, 1.0, 0.5)
    assert agent.calibration.calibrated()
    agent._evaluated = {tuple(int(x) for x in c) for c in agent.proposer._one_knob(inc)}  # all tried
    # calibrated on what it tried, the model's sd for the rest is doubled before a stop: -5% ± 10%
    # is still worth a cheap trial, -5% ± 0.5% is not
    pick, reason = agent._before_stopping(ctx, inc, 0.0, inc, [maybe, doomed], why)
    assert pick is maybe and "x2" in reason
    sure = Scored(Candidate(_code(view, num_warps=8), "scan"), "num_warps=8", gain=-0.05, gain_sd=0.005,
                  worth=0.0, p_fail=0.1, cost=cheap, rate=0.0, mu=-0.05)
    pick, reason = agent._before_stopping(ctx, inc, 0.0, inc, [sure, doomed], why)
    assert pick is None and reason.startswith("calibration: 100%") and reason.endswith(why)
