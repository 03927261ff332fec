"""The search loop's seam: a Strategy proposes the next trial, the loop evaluates and records it.

propose -> choose -> evaluate -> record -> stop are separate steps: `autoopt.loop` owns evaluate,
record and the budget; a Strategy owns propose/choose and may ask to stop. Strategies: `tpe` and
`random` (Optuna samplers), `grid`, and `agent` (cost-aware, profile-guided; autoopt.agent).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from autoopt.results import Measurement


@dataclass
class Decision:
    """What to try next, and why. `params` are the space's flat parameters (see autoopt.space)."""

    params: dict[str, Any]
    source: str  # "baseline" | "sampler:tpe" | "profile:<bucket>" | "neighbour" | "confirm" | ...
    reason: str  # one line a person can read: expected gain, cost, why this one
    expected_gain: float | None = None  # relative objective gain over the incumbent (0.05 = +5%)
    expected_gain_sd: float | None = None
    expected_cost_s: float | None = None  # transition + measurement
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Stop:
    """The strategy's judgement that no further trial is worth it."""

    reason: str


@dataclass
class TrialOutcome:
    """One evaluated trial as strategies see it."""

    number: int  # 0 = baseline
    params: dict[str, Any]
    measurement: Measurement
    objective: float | None  # None when failed or wrong
    objective_ci: tuple[float, float] | None
    cost_s: float  # wall (or simulated) seconds the trial took, transition included
    transition_s: float  # of which applying the configuration (restart/rebuild/recompile)
    decision: Decision | None = None
    diagnosis: str | None = None  # the strategy's one-line explanation of the outcome, if it gave one


@dataclass
class SearchContext:
    """Everything a strategy may look at when proposing."""

    space: Any  # autoopt.space.SearchSpace
    target: Any  # autoopt.targets.base.Target (for transition costs)
    history: list[TrialOutcome]
    budget_left_s: float
    reserve_s: float  # kept back for the final confirmation of the best
    built_params: dict[str, Any] | None  # what the worker has built now
    objective_name: str = "tok_per_s"

    @property
    def incumbent(self) -> TrialOutcome | None:
        ok = [t for t in self.history if t.objective is not None]
        return max(ok, key=lambda t: t.objective) if ok else None

    @property
    def baseline(self) -> TrialOutcome | None:
        return self.history[0] if self.history else None


class Strategy(Protocol):
    name: str

    def propose(self, ctx: SearchContext) -> Decision | Stop:
        ...

    def observe(self, outcome: TrialOutcome, ctx: SearchContext) -> None:
        ...

    # Optional hooks the loop uses when a strategy has them:
    #   diagnose(outcome, history) -> str | object with .line (and .to_dict()) | None
    #       called before the trial is stored: the line is stored with it (extra["diagnosis"] and
    #       the diagnoses table) and shown in the run's log and by `autoopt show`;
    #   best_params() -> params | None: the strategy's own working incumbent (used internally,
    #       e.g. for the early abort of clear losers; what the user is told is best follows the
    #       rule of autoopt.store.analysis).
