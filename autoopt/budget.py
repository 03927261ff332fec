"""The wall-time budget of a run, restarts included.

A run never starts a trial whose expected cost exceeds what is left after the reserve, and keeps the
reserve back for the final confirmation of the best configuration. The clock is the target's
(`Target.now`): wall seconds for a real target, simulated seconds for replay.

Expected trial cost = expected transition seconds (the target's `transition()` estimate, or what such
a transition cost before) + expected measurement seconds (the median of what measurements cost so far).
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Callable

from autoopt.errors import UserError

_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd]?)")


def parse_duration(text: str | float | int) -> float:
    """'90s', '2m', '2h', '1h30m', '1.5h', '45' (seconds) -> seconds. UserError on anything else."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text <= 0:
            raise UserError(f"--budget: expected a positive duration, got {text!r}")
        return float(text)
    s = str(text).strip().lower().replace(" ", "")
    pos, total, parts = 0, 0.0, 0
    while pos < len(s):
        m = _DURATION_RE.match(s, pos)
        if not m or m.end() == pos:
            break
        unit = m.group(2) or "s"
        if not m.group(2) and (pos != 0 or m.end() != len(s)):
            break  # a bare number (seconds) only as the whole text: '1h30' is ambiguous
        total += float(m.group(1)) * _UNITS_S[unit]
        pos, parts = m.end(), parts + 1
    if pos != len(s) or parts == 0 or total <= 0:
        raise UserError(f"--budget: expected a duration like 90s, 2m, 2h or 1h30m, got {text!r}")
    return total


def format_duration(seconds: float) -> str:
    """Compact human form: 95 -> '1m35s', 5400 -> '1h30m', 12.3 -> '12.3s'."""
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    if h:
        return f"{h}h{m:02d}m"
    return f"{m}m{s:02d}s"


@dataclass
class CostEstimator:
    """Learns per-restart-class transition seconds and measurement seconds from finished trials."""

    default_measure_s: float = 10.0
    transition_s: dict[str, list[float]] = field(default_factory=dict)
    measure_s: list[float] = field(default_factory=list)

    def observe(self, restart_class: str, transition_s: float, measure_s: float) -> None:
        self.transition_s.setdefault(restart_class, []).append(max(0.0, transition_s))
        self.measure_s.append(max(0.0, measure_s))

    def observe_measure(self, measure_s: float) -> None:
        """A measurement's seconds alone (e.g. from an earlier run of the study)."""
        self.measure_s.append(max(0.0, measure_s))

    def expected_measure_s(self) -> float:
        return statistics.median(self.measure_s) if self.measure_s else self.default_measure_s

    def expected_transition_s(self, restart_class: str, declared_s: float = 0.0) -> float:
        """What this class of transition cost before (median), else the target's declared estimate."""
        seen = self.transition_s.get(restart_class)
        if seen:
            return max(statistics.median(seen), 0.0)
        return max(declared_s, 0.0)

    def expected_trial_s(self, restart_class: str, declared_transition_s: float = 0.0) -> float:
        return self.expected_transition_s(restart_class, declared_transition_s) + self.expected_measure_s()


@dataclass
class Budget:
    """Wall-time budget on a clock. `reserve_s` is kept back for the final confirmation."""

    total_s: float
    clock: Callable[[], float]
    reserve_s: float = 0.0
    started_at: float | None = None

    def start(self) -> None:
        if self.started_at is None:
            self.started_at = self.clock()

    @property
    def elapsed_s(self) -> float:
        if self.started_at is None:
            return 0.0
        return max(0.0, self.clock() - self.started_at)

    @property
    def left_s(self) -> float:
        return max(0.0, self.total_s - self.elapsed_s)

    @property
    def spendable_s(self) -> float:
        """What trials other than the final confirmation may still use."""
        return max(0.0, self.left_s - self.reserve_s)

    @property
    def fraction_used(self) -> float:
        return min(1.0, self.elapsed_s / self.total_s) if self.total_s > 0 else 1.0

    def can_afford(self, expected_cost_s: float, use_reserve: bool = False) -> bool:
        """Whether a trial expected to take `expected_cost_s` fits (the reserve only when asked)."""
        room = self.left_s if use_reserve else self.spendable_s
        return expected_cost_s <= room

    def set_reserve(self, confirm_cost_s: float, max_fraction: float = 0.25) -> None:
        """Reserve what one confirmation costs, capped at `max_fraction` of the whole budget."""
        self.reserve_s = max(0.0, min(confirm_cost_s, max_fraction * self.total_s))

    def why_not(self, expected_cost_s: float) -> str:
        return (f"next trial expected to take {format_duration(expected_cost_s)}, only "
                f"{format_duration(self.spendable_s)} left (+{format_duration(self.reserve_s)} "
                "kept to confirm the best)")
