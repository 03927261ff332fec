"""What the next trial will cost: moving from the built configuration to a candidate, then measuring.

Transition: the parameters that change, the most expensive restart class among them, and the seconds
that class of change cost. Three sources, best first:
  1. learned online: seconds measured for earlier transitions, per knob (a transition is attributed
     to the knob believed dearest among those that changed) and per restart class;
  2. the target's own estimate (`Target.transition(config).expected_s`), scaled by how far its
     estimates have been off so far for that restart class;
  3. the space file's priors (a knob's `prior.apply_cost_s`, else `priors.apply_cost_s[class]`).
Kernels compiled before cost nothing: when the target says the configuration is cached, no compile
part is added; otherwise the compile part the target declares (or learned compile seconds) is.
Measurement: the median of what measurements cost so far (first: the baseline's).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoopt.agent.view import RESTART_CLASSES, SpaceView


@dataclass
class CostEstimate:
    transition_s: float
    measure_s: float
    restart_class: str
    changed: tuple[str, ...]
    cached: bool

    @property
    def total_s(self) -> float:
        return self.transition_s + self.measure_s

    def text(self) -> str:
        from autoopt.agent.stop import fmt_s

        if self.transition_s < 0.5:
            return f"{fmt_s(self.total_s)} (measure {fmt_s(self.measure_s)}, no {_noun('none')})"
        return (f"{fmt_s(self.total_s)} ({_noun(self.restart_class)} {fmt_s(self.transition_s)} + "
                f"measure {fmt_s(self.measure_s)})")


def _noun(cls: str) -> str:
    return {"none": "rebuild", "recompile": "recompile", "rebuild": "rebuild", "restart": "restart"}[cls]


class CostModel:
    def __init__(self, view: SpaceView, target: Any = None, default_measure_s: float = 60.0) -> None:
        self.view = view
        self.target = target
        self.default_measure_s = default_measure_s
        self.knob_obs: dict[int, list[float]] = {}  # param index -> attributed transition seconds
        self.class_obs: dict[str, list[float]] = {}
        self.target_ratio: dict[str, list[float]] = {}  # measured / target-estimated, per class
        self.measure_obs: list[float] = []

    # ---- learning --------------------------------------------------------------------------------
    def observe(self, prev_code: np.ndarray | None, code: np.ndarray, transition_s: float,
                measure_s: float, target_estimate_s: float | None, cached: bool) -> None:
        if measure_s > 0:
            self.measure_obs.append(measure_s)
        if prev_code is None:
            return  # a fresh start: says nothing about switching one knob
        changed = np.nonzero(prev_code != code)[0]
        if len(changed) == 0:
            return
        cls = self._class_of(changed)
        self.class_obs.setdefault(cls, []).append(transition_s)
        if target_estimate_s is not None and target_estimate_s > 0.5:
            self.target_ratio.setdefault(cls, []).append(transition_s / target_estimate_s)
        if cached or len(changed) == 1:
            dearest = max(changed, key=lambda i: self._knob_s(int(i)))
            self.knob_obs.setdefault(int(dearest), []).append(transition_s)

    # ---- estimates -------------------------------------------------------------------------------
    def measure_s(self) -> float:
        return statistics.median(self.measure_obs) if self.measure_obs else self.default_measure_s

    def _class_of(self, changed: np.ndarray) -> str:
        rank = max((int(self.view.class_rank[i]) for i in changed), default=0)
        return RESTART_CLASSES[rank]

    def _knob_s(self, i: int) -> float:
        seen = self.knob_obs.get(i)
        if seen:
            return statistics.median(seen)
        cls_seen = self.class_obs.get(self.view.params[i].restart_class)
        prior = self.view.params[i].prior_apply_s
        return prior if prior > 0 or not cls_seen else statistics.median(cls_seen)

    def fresh_start_s(self) -> float:
        """What starting from nothing costs (after a failure): the dearest knob's apply seconds."""
        return max((self._knob_s(i) for i in range(len(self.view.params))), default=0.0)

    def estimate(self, built: np.ndarray | None, code: np.ndarray, transition: Any = None) -> CostEstimate:
        """Cost of evaluating `code` with `built` running now (None: nothing runs: a fresh start)."""
        measure = self.measure_s()
        if built is None:
            changed = np.arange(len(code))
        else:
            changed = np.nonzero(built != code)[0]
        names = tuple(self.view.params[int(i)].name for i in changed)
        cls = "restart" if built is None else self._class_of(changed)
        cached = bool(getattr(transition, "cached", False))
        learned = max((self._knob_s(int(i)) for i in changed), default=0.0)
        declared = getattr(transition, "expected_s", None)
        observed = any(int(i) in self.knob_obs for i in changed)
        if declared is not None and declared > 0.5:
            ratios = self.target_ratio.get(cls)
            seconds = declared * (statistics.median(ratios) if ratios else 1.0)
        elif declared is not None and not observed:
            seconds = declared  # the target says (nearly) free and nothing contradicts it yet
        else:
            seconds = learned
        if built is not None and len(changed) == 0:
            seconds = 0.0
        return CostEstimate(transition_s=max(0.0, seconds), measure_s=measure, restart_class=cls,
                            changed=names, cached=cached)

    def estimate_many(self, built: np.ndarray | None, codes: np.ndarray,
                      transitions: list[Any] | None = None) -> list[CostEstimate]:
        return [self.estimate(built, c, transitions[i] if transitions else None)
                for i, c in enumerate(codes)]
