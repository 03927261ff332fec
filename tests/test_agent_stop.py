"""The stop rule: --min-gain parsing, worth-it judgement, budget fit, and reasons a person can read."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from autoopt.search.agent.stop import DEFAULT_MIN_GAIN, MinGain, StopRule
from autoopt.search.cost import CostModel
from autoopt.search.strategy import SearchContext
from autoopt.targets.replay.target import ReplayTarget, replay_space
from autoopt.trial import CostEstimate
from autoopt.errors import UserError


@dataclass
class Cand:
    label: str
    gain: float
    gain_sd: float
    worth: float
    cost: CostEstimate

    @property
    def rate(self) -> float:
        return self.worth / self.cost.total_s


def cand(worth, transition_s=300.0, measure_s=180.0, label="glue=compile", gain=None, sd=0.02):
    return Cand(label, worth if gain is None else gain, sd, worth,
                CostEstimate(transition_s, measure_s, "restart", ("glue",), False))


@pytest.mark.parametrize("text,gain,per_s", [("1%/10min", 0.01, 600), ("0.5%/5m", 0.005, 300),
                                              ("2%/h", 0.02, 3600), ("3% / 90s", 0.03, 90),
                                              ("1%/1hour", 0.01, 3600)])
def test_min_gain_parses(text, gain, per_s):
    mg = MinGain.parse(text)
    assert mg.gain == pytest.approx(gain) and mg.per_s == pytest.approx(per_s)


def test_min_gain_default_and_errors():
    assert MinGain.parse(None).text == DEFAULT_MIN_GAIN == "1%/10min"
    assert MinGain.parse("0").rate == 0.0
    for bad in ("1%", "fast", "1/10min", "%/10min", "1%/0min"):
        with pytest.raises(UserError, match="--min-gain"):
            MinGain.parse(bad)


def test_worth_it_compares_expected_gain_per_second_with_the_rate():
    rule = StopRule("1%/10min")
    # 8 minutes (restart 5 + measure 3): worth it from 0.8% up
    assert rule.worth_it(cand(0.009))
    assert not rule.worth_it(cand(0.007))
    # the same gain for a runtime switch and a 3-minute sweep is worth it
    assert rule.worth_it(cand(0.007, transition_s=0.0))


def test_stop_reason_reads_like_the_case_study():
    rule = StopRule("1%/10min")
    pick, why = rule.check([cand(0.004, gain=0.031, sd=0.02)], budget_left_s=7200, reserve_s=300)
    assert pick is None
    assert why.startswith("best candidate glue=compile +3.1% ± 2.0% (worth +0.4%) for 8m00s "
                          "(restart 5m00s + measure 3m00s)")
    assert why.endswith("< 1%/10min: stopping")


def test_budget_must_fit_the_candidate_and_the_final_confirmation():
    rule = StopRule("1%/10min")
    big, cheap = cand(0.05), cand(0.01, transition_s=0.0, label="moe_experts=grouped")
    ranked = sorted([big, cheap], key=lambda c: -c.rate)
    pick, _ = rule.check(ranked, budget_left_s=3600, reserve_s=300)
    assert pick is ranked[0]
    pick, _ = rule.check(ranked, budget_left_s=480 + 100, reserve_s=300)  # 8-min trial does not fit
    assert pick is cheap
    pick, why = rule.check(ranked, budget_left_s=400, reserve_s=300)
    assert pick is None and why.startswith("budget:") and "final confirmation" in why


def test_the_agent_fits_a_candidate_as_the_loop_does_with_its_overrun_and_its_own_seconds():
    """A run whose trials ran up to 1.9x their estimates and whose loop spends 1 s a trial: an 8-minute
    candidate with 10 minutes spendable does not fit the loop's check (8 x 1.9 + 1 s), so the agent
    takes the cheap one that does, instead of proposing what the loop refuses (which ended runs on
    "budget" with time left)."""
    space = replay_space(ReplayTarget(Path(__file__).resolve().parent / "fixtures" / "replay" / "casestudy.csv"))
    costs = CostModel(space)
    costs.overrun_obs += [1.0, 2.0]
    costs.loop_obs.append(1.0)
    assert costs.needed_s(480.0) == pytest.approx(480.0 * 1.9 + 1.0)
    ctx = SearchContext(space, None, [], budget_left_s=900.0, reserve_s=300.0, built_params=None, costs=costs)
    assert ctx.spendable_s == 600.0 and ctx.fits(300.0) and not ctx.fits(480.0)
    big, cheap = cand(0.05), cand(0.01, transition_s=0.0, label="moe_experts=grouped")
    ranked = sorted([big, cheap], key=lambda c: -c.rate)
    assert StopRule("1%/10min").check(ranked, 900.0, 300.0)[0] is big  # the bare estimate fits
    assert StopRule("1%/10min").check(ranked, 900.0, 300.0, needed=costs.needed_s)[0] is cheap
    pick, why = StopRule("1%/10min").check([big], 900.0, 300.0, needed=costs.needed_s)
    assert pick is None and "needs 8m00s (restart 5m00s + measure 3m00s) (15m13s with this run's overruns" in why


def test_nothing_left_is_a_stop():
    pick, why = StopRule().check([], 1000, 0)
    assert pick is None and "nothing left" in why


def test_too_few_measurements_to_stop_on_explore_a_cheap_candidate():
    """'Nothing is worth it' from a model of a handful of points is not evidence enough: with fewer
    than 10 configurations measured, a cheap candidate (<= 10% of the budget left) is still tried, the
    most optimistic one (gain + 2 sd); a dear one is not; from 10 on, the rule stops."""
    rule = StopRule("1%/10min")
    safe = cand(0.0, transition_s=0.0, measure_s=3.0, label="attention=per_head", gain=-0.09, sd=0.01)
    bold = cand(0.0, transition_s=0.0, measure_s=3.0, label="moe_experts=loop", gain=-0.15, sd=0.06)
    dear = cand(0.0, transition_s=50.0, measure_s=10.0, label="glue=compile", gain=0.0, sd=0.3)
    ranked = [safe, bold, dear]
    pick, why = rule.check(ranked, budget_left_s=100.0, reserve_s=2.0, n_measured=7)
    assert pick is bold and why.startswith("exploring: no candidate is worth 1%/10min by the model, but it "
                                           "rests on 7 measured configurations (fewer than 10)")
    pick, why = rule.check(ranked, budget_left_s=100.0, reserve_s=2.0, n_measured=10)
    assert pick is None and why.endswith("< 1%/10min: stopping")
    pick, why = rule.check([dear], budget_left_s=100.0, reserve_s=2.0, n_measured=3)  # 60 s > 10 s
    assert pick is None and why.startswith("best candidate glue=compile")
    assert rule.check(ranked, budget_left_s=100.0, reserve_s=2.0)[0] is None  # no count: the plain rule
