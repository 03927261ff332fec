"""Exhaustive grid search, ordered so restarts are not repeated.

Every feasible configuration of the space, once, in mixed-radix order with the parameters whose
switch is dearest varying slowest: all runtime-only variants of one build are measured before the
next rebuild, all builds of one process before the next restart. The baseline comes first. Stops when
the grid is exhausted (the loop stops it earlier when the budget runs out).
"""
from __future__ import annotations

from typing import Any

from autoopt.search.strategy import Decision, SearchContext, Stop, TrialOutcome
from autoopt.trial import DecisionSource, RestartClass


class GridStrategy:
    name = "grid"

    def __init__(self, space: Any, seed: int | None = None) -> None:
        self.space = space
        # slowest-varying first: dearest restart class, then the order of the space file
        params = list(space.params)
        self.order = sorted(params, key=lambda p: -RestartClass(space.restart_class_of(p.name)).rank)
        self.size = 1
        for p in self.order:
            self.size *= len(p.choices)
        self._next = 0
        self.skipped_infeasible = 0

    def _point(self, index: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p in reversed(self.order):  # the last parameter varies fastest
            index, r = divmod(index, len(p.choices))
            out[p.name] = p.choices[r]
        return {p.name: out[p.name] for p in self.space.params}

    def propose(self, ctx: SearchContext) -> Decision | Stop:
        if not ctx.history:
            return Decision(params=self.space.baseline_params(), source=DecisionSource.BASELINE.value,
                            reason="trial 0: the starting point every speed-up is relative to")
        seen = {self.space.config_key(t.params) for t in ctx.history}
        while self._next < self.size:
            params = self._point(self._next)
            self._next += 1
            if not self.space.is_feasible(params):
                self.skipped_infeasible += 1
                continue
            if self.space.config_key(params) in seen:
                continue
            return Decision(params=params, source=DecisionSource.GRID.value,
                            reason=f"grid point {self._next} of {self.size} (dearest switches vary slowest)")
        return Stop(f"grid exhausted: all {self.size} points visited "
                    f"({self.skipped_infeasible} infeasible skipped)")

    def observe(self, outcome: TrialOutcome, ctx: SearchContext) -> None:
        """The grid does not adapt."""

