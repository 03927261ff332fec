"""What the search loop asks of a store, in memory: `bench-search` runs thousands of replayed searches
and keeps their trial records here instead of SQLite (no database, no Optuna storage)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any


@dataclass
class _Handle:
    number: int
    trial_id: int
    study_name: str
    run_id: int | None


class MemoryStore:
    """The part of autoopt.store.Store the loop uses, in memory (no database, no Optuna storage)."""

    def __init__(self) -> None:
        self.finished: list[tuple[Any, Any, Any]] = []  # (handle, Measurement, TrialResult)
        self.stop_reason: str | None = None
        self._n = 0

    def mark_interrupted(self, study_name: str) -> list[Any]:
        return []

    def trials(self, study_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    def begin_trial(self, run_id: Any, study_name: str, params: dict[str, Any], config: dict[str, Any],
                    decision: Any, **kwargs: Any) -> _Handle:
        h = _Handle(self._n, self._n, study_name, run_id)
        self._n += 1
        return h

    def finish_trial(self, handle: _Handle, measurement: Any, result: Any) -> None:
        self.finished.append((handle, measurement, result))

    def finish_run(self, run_id: Any, state: str, stop_reason: str) -> None:
        self.stop_reason = stop_reason

    # one process, one run: no other run to take turns with, share a baseline with or wait for
    def measure_turn(self, should_stop: Any = None) -> Any:
        return contextlib.nullcontext()

    def claim(self, study_name: str, should_stop: Any = None) -> Any:
        return contextlib.nullcontext()

    def session_baseline(self, study_name: str, run_id: Any) -> None:
        return None

    def busy_trials(self, study_name: str, run_id: Any) -> list[Any]:
        return []

    def live_runs(self, study_name: str) -> list[Any]:
        return []
