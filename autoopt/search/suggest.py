"""The next trial of a study, for someone who runs it outside autoopt (`autoopt suggest`, and the
advice `autoopt record` prints after storing a trial).

The agent strategy (autoopt.search.agent) proposes on the study's stored history exactly as inside
`autoopt run`: the same gain model, the one cost model (autoopt.search.cost, taught from the
stored trials' transition and measurement seconds) and the same stop rule (MinGain, --min-gain).
Nothing is evaluated and nothing is written to the study: a suggestion is advice; the trial is
stored when its result is recorded (`autoopt record`).

`budget_left_s` is the time the person still means to spend (default 1 h): the stop rule keeps a
final confirmation of the best out of it, and explores a candidate the model does not favour only
when it costs at most a tenth of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoopt.errors import UserError

DEFAULT_BUDGET_LEFT = "1h"
SEED = 0  # the same history gives the same suggestion


@dataclass
class Advice:
    action: str  # "try" (the next trial) or "stop"
    reason: str  # the agent's reason (its stop rule's, when it stops)
    params: dict[str, Any] = field(default_factory=dict)
    changes: dict[str, Any] = field(default_factory=dict)  # knobs that differ from the parent
    parent: int | None = None
    source: str | None = None
    expected_gain: float | None = None
    expected_gain_sd: float | None = None
    worth: float | None = None  # the expected improvement (counts the odds of a win)
    expected_cost: dict[str, Any] | None = None  # the cost model's estimate: transition_s, measure_s, ...
    rate_per_10min: float | None = None  # worth per 10 minutes of cost
    min_gain: str = ""
    line: str = ""  # one line for a person

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items()}


def study_space(store: Any, study: str, given: str | None) -> Any:
    """The study's SearchSpace: `given` (a space name or file), else the space file its last run
    recorded. Validated against the target's declarations; nothing is started."""
    from autoopt.targets.declared import load_declared

    if given is None:
        runs = store.runs(study) if study in store.studies() else []
        given = next((r.settings.get("space_path") for r in reversed(runs)
                      if (r.settings or {}).get("space_path")), None)
        if given is None:
            raise UserError(f"study {study!r} has no space file on record: give --space FILE (its knobs, "
                            f"their values and the objective)")
        if not Path(given).is_file():
            raise UserError(f"study {study!r}: its space file {given} is gone; give --space FILE")
    return load_declared(given)


def history(store: Any, study: str) -> list[Any]:
    """The study's finished trials as strategies see them (TrialOutcome), in number order."""
    from autoopt.search.loop import outcome_from_record

    done = store.trials(study, ("ok", "wrong", "failed"), with_samples=False)
    return [outcome_from_record(r) for r in done if not (r.failure and r.failure.kind == "interrupted")]


def cost_model(space: Any, outcomes: list[Any]) -> Any:
    """The one cost model, taught from the history as a resumed run teaches it."""
    from autoopt.search.cost import CostModel

    costs = CostModel(space)
    built: dict[str, Any] | None = None
    for t in outcomes:
        costs.observe(built, t.params, t.result, t.decision.expected_cost if t.decision else None)
        built = dict(t.params) if t.result.ok else None
    return costs


def suggest(store: Any, study: str, space: Any, min_gain: str | None = None,
            budget_left_s: float | None = None) -> Advice:
    """The agent's next trial for the study (or its reason to stop)."""
    from autoopt.search.agent.stop import MinGain
    from autoopt.search.agent.strategy import AgentStrategy
    from autoopt.search.strategy import SearchContext, Stop
    from autoopt.units import parse_duration

    rule = MinGain.parse(min_gain)
    left_s = budget_left_s if budget_left_s is not None else parse_duration(DEFAULT_BUDGET_LEFT)
    outcomes = [t for t in history(store, study) if space.is_feasible(t.params)]
    costs = cost_model(space, outcomes)
    built = next((dict(t.params) for t in reversed(outcomes) if t.result.ok), None)
    ctx = SearchContext(space=space, target=None, history=outcomes, budget_left_s=left_s,
                        reserve_s=costs.confirm_reserve_s(), built_params=built, costs=costs)
    decision = AgentStrategy(space, seed=SEED, min_gain=rule.text).propose(ctx)
    if isinstance(decision, Stop):
        return Advice("stop", decision.reason, min_gain=rule.text, line=f"stop: {decision.reason}")
    if decision.expected_cost is None:
        decision.expected_cost = costs.estimate(built, decision.params)
    parent = next((t for t in outcomes if t.number == decision.parent), None)
    ref = parent.params if parent is not None else (built or {})
    notes = decision.notes or {}
    rate = notes.get("rate_per_10min")
    advice = Advice("try", decision.reason, params=dict(decision.params),
                    changes={k: v for k, v in decision.params.items() if ref.get(k) != v},
                    parent=decision.parent, source=decision.source, expected_gain=decision.expected_gain,
                    expected_gain_sd=decision.expected_gain_sd, worth=notes.get("worth"),
                    expected_cost=decision.expected_cost.to_json() | {"total_s": decision.expected_cost.total_s,
                                                                      "text": decision.expected_cost.text()},
                    rate_per_10min=rate, min_gain=rule.text)
    advice.line = _try_line(advice, decision, rule)
    return advice


def _try_line(advice: Advice, decision: Any, rule: Any) -> str:
    from autoopt.search.agent.stop import fmt_gain

    what = ", ".join(f"{k}={v}" for k, v in advice.changes.items()) or "the same configuration again"
    gain = fmt_gain(decision.expected_gain, decision.expected_gain_sd) if decision.expected_gain is not None \
        else "a re-measurement"
    worth = f" (worth {fmt_gain(advice.worth)})" if advice.worth is not None else ""
    line = f"next best: {what} {gain}{worth} for ~{decision.expected_cost.text()}"
    if advice.rate_per_10min is not None:
        above = advice.rate_per_10min / 600 >= rule.rate
        line += f" = {100 * advice.rate_per_10min:.2g}%/10min: {'above' if above else 'below'} {rule.text}"
        line += ", go on" if above else f", tried anyway ({decision.reason.rsplit('; ', 1)[-1]})"
    return line
