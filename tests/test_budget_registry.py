"""Budget arithmetic (durations, the confirmation reserve) and the strategy registry: unit tests of the
parts the search loop (tests/test_loop.py) is built on."""
from __future__ import annotations

import pytest

from autoopt.errors import UserError
from autoopt.search import registry as strategies
from autoopt.search.budget import Budget
from autoopt.units import format_duration, parse_duration


# ---- budget arithmetic ---------------------------------------------------------------------------
@pytest.mark.parametrize("text, seconds", [("90s", 90), ("2m", 120), ("2h", 7200), ("1h30m", 5400),
                                           ("1.5h", 5400), ("45", 45), ("1h 30m", 5400), ("2M", 120)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2x", "m", "-1m", "0s", "1h30", "abc", "1m1"])
def test_parse_duration_rejects(text):
    with pytest.raises(UserError, match="--budget: expected a duration like 90s, 2m, 2h or 1h30m"):
        parse_duration(text)


def test_format_duration():
    assert [format_duration(s) for s in (5.25, 42, 95, 5400)] == ["5.2s", "42s", "1m35s", "1h30m"]


def test_budget_keeps_the_reserve_back():
    now = [100.0]
    b = Budget(total_s=120.0, clock=lambda: now[0])
    b.start()
    now[0] += 70.0
    assert b.elapsed_s == 70.0 and b.left_s == 50.0
    b.set_reserve(30.0)
    assert b.reserve_s == 30.0 and b.spendable_s == 20.0  # under 25 % of 120
    assert b.can_afford(20.0) and not b.can_afford(20.5)
    assert b.can_afford(50.0, use_reserve=True) and not b.can_afford(51.0, use_reserve=True)
    b.set_reserve(1000.0)
    assert b.reserve_s == 30.0  # capped at a quarter of the budget
    assert "kept to confirm the best" in b.why_not(25.0)


# ---- the strategy registry -----------------------------------------------------------------------
def test_registry_names_default_and_unknown():
    names = strategies.names()
    assert {"tpe", "random", "gp"} <= set(names)
    assert strategies.default_name() == ("agent" if "agent" in names else "tpe")
    with pytest.raises(UserError, match="unknown strategy 'nope'.*tpe"):
        strategies.get("nope", space=None)


def test_register_a_strategy():
    made = []
    strategies.register("test-only", lambda space, seed=None, **o: made.append((space, seed)) or "S")
    assert strategies.get("test-only", "space", 3) == "S" and made == [("space", 3)]
