"""Where a run starts: the study's finished trials as history (teaching the one cost model what
each transition and measurement cost), then its queue: this run's baseline, then the trials a
killed or interrupted process left unfinished, re-run first."""
from __future__ import annotations

from typing import Any

from autoopt.measurement import Measurement
from autoopt.search.strategy import TrialOutcome
from autoopt.trial import Decision, DecisionSource, TrialState


def outcome_from_record(rec: Any) -> TrialOutcome:
    """A stored TrialRecord as strategies see it (the stored result and decision, as they are)."""
    m = rec.measurement
    if m is None:
        kind = "interrupted" if rec.state == TrialState.INTERRUPTED else "exception"
        m = Measurement.failed(dict(rec.config or {}), kind, "no measurement recorded")
    return TrialOutcome(number=rec.number, params=dict(rec.params), measurement=m, result=rec.result,
                        decision=rec.decision)


def interrupted(rec: Any) -> bool:
    return rec.state == TrialState.INTERRUPTED or (rec.failure is not None and rec.failure.kind == "interrupted")



def history_and_queue(store: Any, space: Any, study: str, costs: Any) -> tuple[list[TrialOutcome], list[Decision]]:
    """(history, queue) of a run starting on `study`; marks the trials of dead runs interrupted."""
    store.mark_interrupted(study)
    records = store.trials(study)
    rerun_of = {r.decision.rerun_of for r in records if r.decision is not None}
    done = [r for r in records if r.state in ("ok", "wrong", "failed") and not interrupted(r)]
    history = [outcome_from_record(r) for r in done]
    built: dict[str, Any] | None = None  # as the earlier runs went: a failure left nothing built
    for t in history:
        costs.observe(built, t.params, t.result, t.decision.expected_cost if t.decision else None)
        built = dict(t.params) if t.result.ok else None
    # The baseline is measured again in every run (a speed-up compares two figures of one session:
    # the machine's state drifts between sessions), unless a run working on the study right now
    # measured it (they share it: autoopt.search.sharing); always profiled, as the first build.
    queue = [Decision(params=space.baseline_params(), source=DecisionSource.BASELINE.value,
                      reason=("the starting point every speed-up is relative to" if not done else
                              "the baseline again: this run's speed-ups are against this session's figure"),
                      profile=True)]
    for r in records:
        if not interrupted(r) or r.number in rerun_of:
            continue
        if r.is_baseline:
            queue[0].rerun_of = r.number
            continue
        if not space.is_feasible(r.params):
            continue  # recorded under another version of the space file
        queue.append(Decision(params=dict(r.params), source=DecisionSource.RESUME.value,
                              reason=f"re-run of trial #{r.number}, interrupted before it finished",
                              rerun_of=r.number))
    return history, queue
