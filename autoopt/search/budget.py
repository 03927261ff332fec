"""The wall-time budget of a run, restarts included: the clock and the reserve, nothing else.

A run never starts a trial whose expected cost exceeds what is left after the reserve, and keeps the
reserve back for the final confirmation of the best configuration. The clock is the target's
(`Target.now`): wall seconds for a real target, simulated seconds for replay. The expected cost of a
trial is the one cost model's (autoopt.search.cost); the budget only says whether it fits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from autoopt.units import format_duration


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
