"""Runs at work on one study at the same time: what another live run is measuring now, and waiting
for its result instead of measuring the same thing twice (the store says which runs are live)."""
from __future__ import annotations

import time
from typing import Any, Callable

from autoopt.trial import Decision, DecisionSource

WAIT_POLL_S = 0.2  # how often a run waiting for another run's trial looks again


def busy_with(store: Any, space: Any, study: str, run_id: int | None, decision: Decision) -> Any:
    """The trial of another live run that makes `decision` redundant: the baseline it measures or
    measured (for a baseline), or the same configuration it is measuring now. None: go ahead."""
    if decision.kind is DecisionSource.BASELINE:
        return store.session_baseline(study, run_id)
    key = space.config_key(decision.params)
    for t in store.busy_trials(study, run_id):
        if set(t.params) == set(decision.params) and space.config_key(t.params) == key:
            return t
    return None


def wait_until_done(store: Any, study: str, busy: Any, stopping: Callable[[], bool]) -> str:
    """Poll until `busy` (a trial of another run) ends, its run dies, or a stop is asked for;
    returns its state then."""
    state = busy.state
    while state == "running" and not stopping():
        time.sleep(WAIT_POLL_S)
        state = store.trial(study, busy.number).state
        if state == "running" and busy.run_id not in store.live_runs(study):
            break  # its run died: the trial stays for `mark_interrupted` of the next run
    return state
