"""Which trial of a run is the baseline, which is best (the rule of `autoopt best`), and the
strategy's own working incumbent — read by the loop for its result, the early abort and the final
confirmation."""
from __future__ import annotations

from typing import Any

from autoopt.search.strategy import TrialOutcome
from autoopt.store.analysis import Mix, ObjectiveKey, best_outside_noise, throughput_at


def baseline_of(history: list[TrialOutcome], number: int | None) -> TrialOutcome | None:
    """The successful baseline trial `number` (the session's: the loop knows which); None without."""
    if number is None:
        return None
    return next((t for t in history if t.number == number and t.objective is not None), None)


def objective_key(space: Any) -> ObjectiveKey:
    """The figure a run ranks by, as `autoopt best` reads it back: the one concurrency of the
    space's objective, or its weighted mix (the run records it as settings["objective_mix"])."""
    weights = space.objective.weights
    return next(iter(weights)) if len(weights) == 1 else Mix.of(weights)


def best_of(finished: list[TrialOutcome], base: TrialOutcome | None, key: ObjectiveKey) -> TrialOutcome | None:
    """What the user is told is best: the rule of `autoopt best` (autoopt.store.analysis, db/README
    "Definitions") on the trials of the study: the highest median tok/s at the objective (`key`: a
    concurrency, or the weighted mix) among trials whose 95% CI low end is above the baseline's CI
    high end; the baseline when none is (or the highest objective measured while there is no
    baseline). (Until 2026-12-07 a mix was ranked at its heaviest concurrency here while `autoopt
    best` ranked by the mix: an H100 run printed best #121, `best` named #83.)"""
    fig = lambda t: throughput_at(t.measurement.tok_per_s, key) if t.objective is not None else None  # noqa: E731
    if base is None or fig(base) is None:
        ok = [t for t in finished if t.objective is not None]
        return max(ok, key=lambda t: t.objective) if ok else None
    # significant on the figure, and never below the baseline on the objective itself (at one
    # concurrency of a mix a trial can rise while the mix falls): what is called best is a gain
    cands = [(t, fig(t), t.number) for t in finished if t is not base and fig(t) is not None
             and t.objective > base.objective]
    best, _ = best_outside_noise(cands, fig(base))
    return base if best is None else best


def working_incumbent(strategy: Any, space: Any, history: list[TrialOutcome],
                      reported_best: TrialOutcome | None) -> TrialOutcome | None:
    """The strategy's own incumbent (`best_params()`: e.g. the agent's best after its repeats),
    its median repeat; else the reported best. Internal only (the early abort of clear losers):
    against a lucky first figure, that abort would cut short configurations as good as the best."""
    pick = strategy.best_params() if hasattr(strategy, "best_params") else None
    if pick is not None:
        key = space.config_key(pick)
        same = sorted((t for t in history if t.objective is not None and space.config_key(t.params) == key),
                      key=lambda t: t.objective)
        if same:
            return same[(len(same) - 1) // 2]
    return reported_best


def profiled_before(space: Any, history: list[TrialOutcome], params: dict[str, Any]) -> bool:
    """Whether the study holds a profile (buckets) of the configuration `params` build."""
    key = space.config_key(params)
    return any(t.measurement.buckets_ms and set(t.params) == set(params) and space.config_key(t.params) == key
               for t in history)


def abort_below(inc: TrialOutcome | None, space: Any, enabled: bool) -> dict[str, Any]:
    """The early abort of clear losers (a search trial stops sampling once its CI top is under the
    incumbent's figure): only against a single-concurrency objective; {} when it does not apply."""
    weights = space.objective.weights
    if not enabled or inc is None or len(weights) != 1:
        return {}
    c = str(next(iter(weights)))
    tp = inc.measurement.tok_per_s.get(c)
    return {"abort_below": {c: tp.median}} if tp is not None else {}
