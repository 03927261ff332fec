"""The search loop's seam: a Strategy proposes the next trial, the loop evaluates and records it.

propose -> choose -> evaluate -> record -> stop are separate steps: `autoopt.search.loop` owns evaluate,
record, the budget and the one cost model (autoopt.search.cost, handed to strategies in the context);
a Strategy owns propose/choose and may ask to stop. Strategies: `tpe` and `random` (Optuna samplers),
`grid`, and `agent` (cost-aware, profile-guided; autoopt.search.agent). The records they exchange —
Decision, TrialResult, Diagnosis — are autoopt.trial's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from autoopt.measurement import Measurement
from autoopt.search.cost import CostModel
from autoopt.trial import Decision, DecisionSource, Diagnosis, TrialResult

__all__ = ["Decision", "DecisionSource", "Diagnosis", "SearchContext", "Stop", "Strategy", "TrialOutcome"]


@dataclass
class Stop:
    """The strategy's judgement that no further trial is worth it."""

    reason: str


@dataclass
class TrialOutcome:
    """One evaluated trial as strategies see it: what was tried, what was measured, what the loop
    made of it (computed once, the same record the store holds)."""

    number: int  # 0 = baseline
    params: dict[str, Any]
    measurement: Measurement
    result: TrialResult
    decision: Decision | None = None

    @property
    def objective(self) -> float | None:  # None when failed or wrong
        return self.result.objective

    @property
    def objective_ci(self) -> tuple[float, float] | None:
        return self.result.objective_ci

    @property
    def cost_s(self) -> float:  # wall (or simulated) seconds the trial took, transition included
        return self.result.cost_s

    @property
    def transition_s(self) -> float:  # of which applying the configuration
        return self.result.transition_s

    @property
    def diagnosis(self) -> str | None:  # the strategy's one-line explanation, if it gave one
        return self.result.diagnosis.verdict if self.result.diagnosis is not None else None


@dataclass
class SearchContext:
    """Everything a strategy may look at when proposing."""

    space: Any  # autoopt.space.space.SearchSpace
    target: Any  # autoopt.targets.base.Target (for the facts of a transition)
    history: list[TrialOutcome]
    budget_left_s: float
    reserve_s: float  # kept back for the final confirmation of the best
    built_params: dict[str, Any] | None  # what the target has built now (None: nothing)
    costs: CostModel  # the loop's one cost model (read it; the loop teaches it)
    objective_name: str = "tok_per_s"

    @property
    def spendable_s(self) -> float:
        """The budget left outside the confirmation's reserve."""
        return max(0.0, self.budget_left_s - self.reserve_s)

    def fits(self, expected_s: float) -> bool:
        """Whether a search trial expected at `expected_s` fits: the loop's own check (CostModel.needed_s)."""
        return self.costs.needed_s(expected_s) <= self.spendable_s


class Strategy(Protocol):
    name: str

    def propose(self, ctx: SearchContext) -> Decision | Stop:
        ...

    def observe(self, outcome: TrialOutcome, ctx: SearchContext) -> None:
        ...

    # Optional hooks the loop uses when a strategy has them:
    #   diagnose(outcome, history) -> Diagnosis | None
    #       called once, before the trial is stored: the diagnosis is stored with the result (and
    #       in the diagnoses table), reaches `observe` in outcome.result, and is shown in the run's
    #       log and by `autoopt show`;
    #   best_params() -> params | None: the strategy's own working incumbent (used internally,
    #       e.g. for the early abort of clear losers; what the user is told is best follows the
    #       rule of autoopt.store.analysis).
