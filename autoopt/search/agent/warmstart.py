"""Warm start: another study's measured effects as prior evidence, discounted, never as facts.

Another study (another preset, another GPU, the CPU) measured configurations of a space with the
same knobs. Its gains over its own baseline, log(objective / its baseline's), enter the agent's GP
as extra observations with a wide noise: DISCOUNT_SD (a tenth of a log unit: "about 10 % off") at
first, then the misfit the run itself observed — the root mean square difference between this run's
gains and what a GP fitted on the other study alone predicts for the same configurations (the
baseline aside: both call it 0) — whichever is larger; once that misfit reaches USELESS_FRACTION of
the spread of the other study's own gains, knowing them predicts this run no better than their mean:
they are dropped. Its gains are read up to a constant (the mean difference, re-estimated with the
misfit): another GPU may shift every configuration against its baseline alike. So a
similar study sharpens the model from the first trial, and a dissimilar one loses its say as soon as
the run measured a few configurations it also had. What the other study measured is never treated as
measured here: it is not the incumbent, not skipped as a candidate, and its failures are not counted.

    agent.warm_start(outcomes)   # objects with .params and .objective (TrialOutcome, TrialRecord)
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from autoopt.search.agent.view import SpaceView

DISCOUNT_SD = 0.1
MIN_COMMON = 3  # configurations measured here (baseline aside) before the misfit replaces the discount
MAX_SD = 3.0  # a prior this far off says nothing
USELESS_FRACTION = 0.8


class PriorEvidence:
    def __init__(self, view: SpaceView, outcomes: list[Any], discount_sd: float = DISCOUNT_SD,
                 source: str = "another study") -> None:
        self.source, self.discount_sd = source, discount_sd
        measured: dict[tuple[int, ...], list[float]] = {}
        base_obj = None
        for t in outcomes:
            obj = _objective(t)
            code = view.encode(dict(getattr(t, "params", {}) or {}))
            if obj is None or obj <= 0 or code is None:
                continue
            key = tuple(int(c) for c in code)
            measured.setdefault(key, []).append(math.log(obj))
            if base_obj is None and key == tuple(int(c) for c in view.base_code):
                base_obj = obj
        if base_obj is None:  # no baseline measured there: its gains have no reference
            measured = {}
        ref = math.log(base_obj) if base_obj else 0.0
        self.keys = list(measured)
        self.y = {k: float(np.mean(v)) - ref for k, v in measured.items()}
        self.X = np.array(self.keys, dtype=np.int64).reshape(len(self.keys), len(view.params))
        self.misfit_sd: float | None = None
        self._base_key = tuple(int(c) for c in view.base_code)
        gains = np.array(list(self.y.values()))
        self.spread = float(gains.std()) if len(gains) > 1 else 0.0
        self.useful = True
        self.offset = 0.0
        self._model = None
        if len(self.keys):
            from autoopt.search.agent.model import GainModel

            self._model = GainModel(view)  # the other study alone: what it predicts for this run
            self._model.fit(self.X, np.array([self.y[k] for k in self.keys]), np.full(len(self.keys), 0.01))

    def __len__(self) -> int:
        return len(self.keys)

    def update(self, own: dict[tuple[int, ...], float]) -> bool:
        """Re-estimate the misfit from this run's gains (key -> log gain); True when it changed."""
        common = [k for k in own if k != self._base_key]
        if len(common) < MIN_COMMON or self._model is None:
            return False
        mu, _ = self._model.predict(np.array(common, dtype=np.int64), scaled=False)
        diff = np.array([own[k] for k in common]) - mu
        self.offset = float(diff.mean())  # a shift of every gain (another baseline) is not a misfit
        misfit = float(np.sqrt(np.mean((diff - self.offset) ** 2)))
        useful = misfit < USELESS_FRACTION * self.spread
        changed = useful != self.useful or self.misfit_sd is None or \
            abs(misfit - self.misfit_sd) > 0.1 * max(self.misfit_sd, 1e-3)
        if changed:
            self.misfit_sd, self.useful = misfit, useful
        return changed

    def sd(self) -> float:
        return min(MAX_SD, max(self.discount_sd, self.misfit_sd or 0.0))

    def rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(codes, log gains, sd) of the prior observations (none once they proved useless)."""
        n = len(self.keys) if self.useful else 0
        return self.X[:n], np.array([self.y[k] + self.offset for k in self.keys[:n]]), np.full(n, self.sd())

    def text(self) -> str:
        if not self.useful:
            return (f"warm start: {self.source}'s gains miss this run's by {100 * (self.misfit_sd or 0):.0f}% "
                    f"(log rms), as much as they vary: no longer used")
        return (f"warm start: {len(self)} configurations of {self.source}, each worth a measurement "
                f"± {100 * self.sd():.0f}% (log sd)")


def _objective(t: Any) -> float | None:
    obj = getattr(t, "objective", None)
    if obj is None and getattr(t, "result", None) is not None:
        obj = getattr(t.result, "objective", None)
    return float(obj) if isinstance(obj, (int, float)) and math.isfinite(obj) else None
