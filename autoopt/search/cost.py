"""The one cost model: what the next trial will cost, learned from what earlier trials cost.

The loop asks it before every trial (the budget check and the expected cost stored with the trial),
the agent asks it to rank candidates, and `autoopt show` prints its prediction next to what the
transition really took. Targets only report facts about a transition (autoopt.targets.base.Transition:
the restart class, the knobs that change, whether the kernels are cached, and — a recorded table only —
the seconds it knows the switch takes); the seconds are estimated here alone.

Transition seconds, best source first:
  1. the target's known figure (`Transition.known_s`), scaled by how far such figures have been off
     for that restart class so far;
  2. learned online: seconds measured for earlier transitions, per parameter (a transition is
     attributed to the parameter believed dearest among those that changed) and per restart class,
     cold and warm apart: a switch whose kernels this worker compiled before (`Transition.cached`)
     skips the compile, a fresh worker compiles everything again; a warm switch never seen for a
     parameter is its cold figure times the warm/cold ratio learned on other parameters (at first
     WARM_FRACTION);
  3. the space file's priors (a knob's `prior.apply_cost_s`, else `priors.apply_cost_s[class]`).
Nothing changed: free. Nothing built (the first trial, or after a failure): a fresh start — unless
the target says a process that has built before lives on (a failure its worker survived: the
Transition is "rebuild" and `cached`). What it holds is unknown but its caches are warm: the seconds
are learned from such trials (`relaunch_obs`); before the first, the dearest knob's warm switch. (On the live H200
every trial after a failure was predicted at the cold step compile, 2 min 30 s, and took 1-24 s; the
run stopped itself with 4 minutes left.)
Measurement seconds: the median of what successful measurements cost so far.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping

from autoopt.trial import CostEstimate, RestartClass, TrialResult

WARM_FRACTION = 0.25  # a cached switch's share of its cold seconds until runs say otherwise


@dataclass(frozen=True)
class ParamCost:
    name: str
    restart_class: RestartClass  # the dearest switch of this parameter, as the space declares it
    prior_s: float  # what the space file says switching it costs


def param_costs(space: Any) -> list[ParamCost]:
    """Each parameter of the space with its restart class and prior apply seconds."""
    knobs = {k.name: k for k in getattr(space, "knobs", [])}
    apply_cost = dict(getattr(space, "apply_cost_s", {}) or {})
    out = []
    for p in space.params:
        knob = knobs.get(p.knob)
        cls = RestartClass(knob.restart_class if knob is not None else space.restart_class_of(p.name))
        own = getattr(knob, "prior_apply_cost_s", None)
        out.append(ParamCost(p.name, cls, float(own if own is not None else apply_cost.get(cls.value, 0.0))))
    return out


class CostModel:
    def __init__(self, space: Any, default_measure_s: float = 60.0) -> None:
        self.params = param_costs(space)
        self.default_measure_s = default_measure_s
        self.param_obs: dict[int, list[float]] = {}  # parameter index -> attributed cold transition seconds
        self.warm_obs: dict[int, list[float]] = {}  # ... of switches whose kernels were cached
        self.class_obs: dict[str, list[float]] = {}  # restart class -> transition seconds
        self.known_ratio: dict[str, list[float]] = {}  # measured / the target's known figure, per class
        self.measure_obs: list[float] = []
        self.relaunch_obs: list[float] = []  # transitions from nothing known into a live process
        self.dearest_seen_s = 0.0  # the dearest transition of a successful trial, fresh starts included

    # ---- learning --------------------------------------------------------------------------------
    def observe(self, built: Mapping[str, Any] | None, params: Mapping[str, Any], result: TrialResult,
                estimate: CostEstimate | None = None) -> None:
        """One finished trial: `built` was running before it (None: nothing), `estimate` is what
        this model predicted for it (its known figure and cached flag are the target's facts)."""
        if result.ok:
            self.dearest_seen_s = max(self.dearest_seen_s, result.transition_s)
            if result.measure_s > 0:
                self.measure_obs.append(result.measure_s)
        if built is None:  # says nothing about switching one parameter
            if result.ok and estimate is not None and _warm_relaunch(estimate):
                self.relaunch_obs.append(result.transition_s)
            return
        changed = self._changed(built, params)
        if not changed:
            return
        cls = self._class_of(changed).value
        seconds = result.transition_s
        self.class_obs.setdefault(cls, []).append(seconds)
        known = estimate.known_s if estimate is not None else None
        if known is not None and known > 0.5:
            self.known_ratio.setdefault(cls, []).append(seconds / known)
        cached = estimate is not None and estimate.cached
        if cached or len(changed) == 1:
            dearest = max(changed, key=lambda i: self._param_s(i, cached))
            (self.warm_obs if cached else self.param_obs).setdefault(dearest, []).append(seconds)

    # ---- estimates -------------------------------------------------------------------------------
    def measure_s(self) -> float:
        return statistics.median(self.measure_obs) if self.measure_obs else self.default_measure_s

    def fresh_start_s(self) -> float:
        """What starting from nothing costs (after a failure): the dearest parameter's apply seconds."""
        return max((self._param_s(i) for i in range(len(self.params))), default=0.0)

    def estimate(self, built: Mapping[str, Any] | None, params: Mapping[str, Any],
                 transition: Any = None) -> CostEstimate:
        """Cost of evaluating `params` with `built` running now (None: nothing runs: a fresh start);
        `transition` is the target's Transition for it, when asked."""
        changed = list(range(len(self.params))) if built is None else self._changed(built, params)
        cls = RestartClass.RESTART if built is None else self._class_of(changed)
        known = getattr(transition, "known_s", None)
        live = built is None and transition is not None and _warm_relaunch(transition)
        if live:
            cls = RestartClass.REBUILD
        cached = bool(getattr(transition, "cached", False)) and (built is not None or live)
        observed = any(i in (self.warm_obs if cached else self.param_obs) for i in changed)
        if known is not None and known > 0.5:
            ratios = self.known_ratio.get(cls.value)
            seconds = known * (statistics.median(ratios) if ratios else 1.0)
        elif known is not None and not observed:
            seconds = known  # the target says (nearly) free and nothing contradicts it yet
        elif live and self.relaunch_obs:
            seconds = statistics.median(self.relaunch_obs)
        else:
            seconds = max((self._param_s(i, cached) for i in changed), default=0.0)
        if built is not None and not changed:
            seconds = 0.0
        return CostEstimate(transition_s=max(0.0, seconds), measure_s=self.measure_s(),
                            restart_class=cls.value, changed=tuple(self.params[i].name for i in changed),
                            cached=cached, known_s=known)

    def confirm_reserve_s(self) -> float:
        """What re-measuring the best may need: the dearest transition seen, then one measurement."""
        return self.measure_s() + self.dearest_seen_s

    # ---- helpers ---------------------------------------------------------------------------------
    def _changed(self, built: Mapping[str, Any], params: Mapping[str, Any]) -> list[int]:
        return [i for i, p in enumerate(self.params) if built.get(p.name) != params.get(p.name)]

    def _class_of(self, changed: list[int]) -> RestartClass:
        return RestartClass.dearest(self.params[i].restart_class for i in changed)

    def _param_s(self, i: int, cached: bool = False) -> float:
        """Seconds switching parameter i costs: cold (compiled afresh) or warm (kernels cached)."""
        if cached:
            warm = self.warm_obs.get(i)
            return statistics.median(warm) if warm else self._cold_s(i) * self.warm_fraction()
        return self._cold_s(i)

    def _cold_s(self, i: int) -> float:
        seen = self.param_obs.get(i)
        if seen:
            return statistics.median(seen)
        cls_seen = self.class_obs.get(self.params[i].restart_class.value)
        prior = self.params[i].prior_s
        return prior if prior > 0 or not cls_seen else statistics.median(cls_seen)

    def warm_fraction(self) -> float:
        """Warm over cold seconds, from the parameters measured both ways (WARM_FRACTION before)."""
        ratios = [statistics.median(w) / statistics.median(self.param_obs[i]) for i, w in self.warm_obs.items()
                  if self.param_obs.get(i) and statistics.median(self.param_obs[i]) > 0]
        return min(1.0, statistics.median(ratios)) if ratios else WARM_FRACTION


def _warm_relaunch(t: Any) -> bool:
    """Nothing known runs, but the target's process has built before and lives on (its "rebuild",
    cached). With nothing built any other transition is a fresh start; a target that knows its
    seconds (a recorded table) gives them itself."""
    return (getattr(t, "restart_class", None) == RestartClass.REBUILD.value
            and bool(getattr(t, "cached", False)) and getattr(t, "known_s", None) is None)
