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
A switch may redo a knob's build work though that knob keeps its value (`Transition.redone`: under
step_compile every new configuration re-traces the step, under CUDA graphs every switch captures
again): its seconds are learned apart (`redo_obs`), cold and warm apart (a re-trace that compiles a
new kernel took 8-12 s on the H200, one whose kernels were all cached 0.5-0.8 s), before the first
the knob's warm switch (a rebuild-class knob's switch as measured: a re-capture repeats the capture).
A live process after a failure that is not warm for the configuration but
names a redo (it step-compiled before) pays that redo, cold, not a fresh start.
Nothing changed: free. Nothing built (the first trial, or after a crash): a fresh start, which costs
a worker's start (learned from fresh starts of configurations that build nothing beyond the
baseline, else the space's restart prior) plus the dearest compile of the knobs the configuration
sets away from the baseline; a restart-class knob's own restart is one start, not a second (on the
live H200 the first trial, the baseline, was predicted at the step compile's 150 s, the space's
dearest knob, and took 15-19 s). After a failure its worker survived (the target's Transition is
"rebuild" and `cached`: a process that has built before lives on) what it holds is unknown but its
caches are warm: the seconds are learned from such trials (`relaunch_obs`); before the first, the
dearest knob's warm switch. (On the live H200 every trial after a failure was predicted at the cold
step compile, 2 min 30 s, and took 1-24 s; the run stopped itself with 4 minutes left.)
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
    knob: str  # the target's knob the parameter sets (per layer class, or the global knob itself)
    restart_class: RestartClass  # the dearest switch of this parameter, as the space declares it
    prior_s: float  # what the space file says switching it costs
    own_prior: bool = False  # the knob's own figure (`prior.apply_cost_s`), not its class's default


def param_costs(space: Any) -> list[ParamCost]:
    """Each parameter of the space with its restart class and prior apply seconds."""
    knobs = {k.name: k for k in getattr(space, "knobs", [])}
    apply_cost = dict(getattr(space, "apply_cost_s", {}) or {})
    out = []
    for p in space.params:
        knob = knobs.get(p.knob)
        cls = RestartClass(knob.restart_class if knob is not None else space.restart_class_of(p.name))
        own = getattr(knob, "prior_apply_cost_s", None)
        out.append(ParamCost(p.name, p.knob, cls, float(own if own is not None else apply_cost.get(cls.value, 0.0)),
                             own_prior=own is not None))
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
        self.loop_obs: list[float] = []  # the search loop's own seconds per trial, around the measurement
        self.overrun_obs: list[float] = []  # a trial's seconds over its estimated seconds (a ratio)
        self.relaunch_obs: list[float] = []  # transitions from nothing known into a live process
        self.redo_obs: dict[tuple[int, bool], list[float]] = {}  # (parameter, cached) -> redo seconds
        self.start_obs: list[float] = []  # fresh starts that built nothing beyond the baseline
        self.baseline = dict(space.baseline_params()) if hasattr(space, "baseline_params") else {}
        self.restart_prior_s = float((getattr(space, "apply_cost_s", {}) or {}).get("restart", 0.0))
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
            if estimate is not None and estimate.total_s > 0:
                self.overrun_obs.append(result.cost_s / estimate.total_s)
        if built is None:  # says nothing about switching one parameter
            if result.ok and estimate is not None and _warm_relaunch(estimate):
                self.relaunch_obs.append(result.transition_s)
            elif result.ok and (estimate is None or estimate.known_s is None) and not self._beyond_baseline(params):
                self.start_obs.append(result.transition_s)
            return
        changed = self._changed(built, params)
        redone = self._redone(estimate)
        if not changed:
            return
        cls = self._class_of(changed).value
        seconds = result.transition_s
        cached = estimate is not None and estimate.cached
        redo = {i: self._redo_s(i, cached) for i in redone}
        if redo and max(redo.values()) >= max(self._param_s(i, cached) for i in changed):
            # the redone work took the time: learned apart, and not as what the changed class costs
            self.redo_obs.setdefault((max(redo, key=redo.get), cached), []).append(seconds)
            return
        self.class_obs.setdefault(cls, []).append(seconds)
        known = estimate.known_s if estimate is not None else None
        if known is not None and known > 0.5:
            self.known_ratio.setdefault(cls, []).append(seconds / known)
        if cached or len(changed) == 1:
            dearest = max(changed, key=lambda i: self._param_s(i, cached))
            (self.warm_obs if cached else self.param_obs).setdefault(dearest, []).append(seconds)

    # ---- estimates -------------------------------------------------------------------------------
    def measure_s(self) -> float:
        return statistics.median(self.measure_obs) if self.measure_obs else self.default_measure_s

    def observe_loop(self, seconds: float) -> None:
        """What one trial cost the search loop itself on the budget's clock, outside the target's
        transition and measurement (choosing it, recording it, explaining it)."""
        self.loop_obs.append(max(0.0, seconds))

    def overrun(self) -> float:
        """How far a trial may run over its estimate, as a factor: the 90th percentile of this run's
        actual / estimated seconds (1 before two are seen, or when trials come in under). A search
        trial starts only where its estimate times this fits before the final confirmation's reserve
        (on the CPU's 2-minute run trials of 2.2 s expected took 1.9-3.3 s, and the last one ate the
        reserve: the best went unconfirmed)."""
        if len(self.overrun_obs) < 2:
            return 1.0
        return max(1.0, statistics.quantiles(self.overrun_obs, n=10, method="inclusive")[-1])

    def needed_s(self, expected_s: float) -> float:
        """What a search trial expected at `expected_s` must find in the budget: its estimate times
        this run's overrun, plus the loop's own seconds. The loop's budget check and the agent's
        choice of a candidate that fits both ask this (the agent once checked the bare estimate, and
        a run could end on the budget with a cheaper candidate that would have fitted)."""
        return expected_s * self.overrun() + self.loop_s()

    def loop_s(self) -> float:
        """The loop's own seconds a trial (median; 0 before the first trial and on a simulated clock,
        which only the target advances): the budget checks add it to a trial's estimate."""
        return statistics.median(self.loop_obs) if self.loop_obs else 0.0

    def fresh_start_s(self) -> float:
        """The agent's penalty for a failure (nothing trusted runs after it): the dearest parameter's
        apply seconds, a bound on any configuration's fresh start (`estimate(None, params)` gives
        one configuration's)."""
        return max((self._param_s(i) for i in range(len(self.params))), default=0.0)

    def estimate(self, built: Mapping[str, Any] | None, params: Mapping[str, Any],
                 transition: Any = None) -> CostEstimate:
        """Cost of evaluating `params` with `built` running now (None: nothing runs: a fresh start);
        `transition` is the target's Transition for it, when asked."""
        changed = list(range(len(self.params))) if built is None else self._changed(built, params)
        known = getattr(transition, "known_s", None)
        # nothing trusted runs, but the target's process lives on (after a failure): warm for `params`,
        # a relaunch; not warm but naming the build it redoes (it step-compiled before), that redo
        live = built is None and _warm_relaunch(transition)
        retrace = built is None and not live and _relaunch(transition) and bool(self._redone(transition))
        redone = self._redone(transition) if built is not None or retrace else []
        if live or retrace:
            cls = RestartClass.REBUILD
        else:
            cls = RestartClass.RESTART if built is None else self._class_of(changed)
        cached = bool(getattr(transition, "cached", False)) and (built is not None or live)
        observed = any(i in (self.warm_obs if cached else self.param_obs) for i in changed)
        if known is not None and known > 0.5:
            ratios = self.known_ratio.get(cls.value)
            seconds = known * (statistics.median(ratios) if ratios else 1.0)
        elif known is not None and (not observed or built is None):
            # the target says (nearly) free and nothing contradicts it yet; or a fresh start, which a
            # target that knows its seconds prices itself (its fresh starts never teach `start_obs`:
            # a Kernel Tuner cache's start after an invalid row was predicted at the 30 s restart
            # prior for every candidate, took 0.5 s, and the run stopped itself on the 30 s)
            seconds = known
        elif live:
            seconds = self._relaunch_s(changed)
        elif retrace:
            seconds = max(self._redo_s(i, False) for i in redone)
        elif built is None:
            seconds = self._fresh_s(params)
        else:
            seconds = max([self._param_s(i, cached) for i in changed] + [self._redo_s(i, cached) for i in redone],
                          default=0.0)
        if built is not None and not changed:
            seconds, redone = 0.0, []
        shown = cls if built is None else self._class_of(changed + redone)
        return CostEstimate(transition_s=max(0.0, seconds), measure_s=self.measure_s(),
                            restart_class=shown.value, changed=tuple(self.params[i].name for i in changed),
                            cached=cached, known_s=known, redone=tuple(self.params[i].name for i in redone))

    def confirm_reserve_s(self, built: Mapping[str, Any] | None = None, best: Mapping[str, Any] | None = None,
                          facts: Any = None) -> float:
        """What re-measuring `best` needs after one more trial: going back to it, then a measurement.
        Back from the build now is its estimate (`facts`: the target's Transition to `best`); the
        next trial moves the worker by one more switch, which a worker that built `best` reverses
        warm (`return_bound_s`). Without a best or a build: the dearest transition seen (on the H200
        that kept 1 min 38 s back while each confirmation took 4-5 s: h200_live_10m_run5)."""
        if best is None or built is None:
            return self.measure_s() + self.dearest_seen_s
        back_now = self.estimate(built, best, facts).transition_s
        return self.measure_s() + max(back_now, self.return_bound_s())

    def return_bound_s(self) -> float:
        """The dearest switch back to a configuration this worker built: any parameter's warm switch
        (a restart-class one starts a new worker, whose in-process caches are cold), or a redo."""
        back = [self._param_s(i, cached=p.restart_class != RestartClass.RESTART) for i, p in enumerate(self.params)]
        return max(back + [self._redo_s(i, True) for i, _ in self.redo_obs], default=0.0)

    # ---- helpers ---------------------------------------------------------------------------------
    def _changed(self, built: Mapping[str, Any], params: Mapping[str, Any]) -> list[int]:
        return [i for i, p in enumerate(self.params) if built.get(p.name) != params.get(p.name)]

    def _redone(self, facts: Any) -> list[int]:
        """Indices of the parameters whose build a transition (or its stored estimate) redoes: a
        Transition names knobs, an estimate parameters; a global knob is its one parameter."""
        names = set(getattr(facts, "redone", ()) or ())
        return [i for i, p in enumerate(self.params) if p.name in names or p.knob in names]

    def _beyond_baseline(self, params: Mapping[str, Any]) -> list[int]:
        return [i for i, p in enumerate(self.params) if params.get(p.name) != self.baseline.get(p.name)]

    def start_s(self) -> float:
        """A new worker's start with the baseline built."""
        return statistics.median(self.start_obs) if self.start_obs else self.restart_prior_s

    def _fresh_s(self, params: Mapping[str, Any]) -> float:
        """A fresh start building `params`: the start, plus the dearest compile inside it of what differs
        from the baseline; a restart-class knob's seconds already are a whole start."""
        beyond = self._beyond_baseline(params)
        restart = RestartClass.RESTART
        inside = max((self._cold_s(i) for i in beyond if self.params[i].restart_class != restart), default=0.0)
        restarts = max((self._cold_s(i) for i in beyond if self.params[i].restart_class == restart), default=0.0)
        return max(self.start_s() + inside, restarts)

    def _redo_s(self, i: int, cached: bool = False) -> float:
        """Seconds redoing parameter i's build (a re-trace, a new capture) in a worker that built it:
        learned for `cached` (the target's facts: every kernel it needs was compiled), else from the
        other kind, else its warm switch (priced cold, the first re-trace under step_compile read
        2 min 30 s and a resumed H200 run stopped itself on it: h200_live_10m_run4, run2.log). A
        rebuild-class knob's first redo (a new CUDA graph capture) is its switch as measured: a
        re-capture repeats the work of switching the graphs on, which no kernel cache shortens (the
        first re-capture priced as a warm fraction read 0.4 s on the H200 and took 1.1-1.4 s)."""
        seen = self.redo_obs.get((i, cached))
        if seen:
            return statistics.median(seen)
        other = self.redo_obs.get((i, not cached))
        if other:  # a cached redo before the first: the cold redo scaled as cached switches are
            return statistics.median(other) * (self.warm_fraction() if cached else 1.0)
        return self._param_s(i, cached=self.params[i].restart_class != RestartClass.REBUILD)

    def _relaunch_s(self, changed: list[int]) -> float:
        """A relaunch into a live worker whose kernels are all cached: learned from relaunches, else
        what this run's cached switches took (its build is one of them: on the H200 such relaunches
        took 0.5-3.6 s, six of them predicted at 37.5 s, the step compile's warm figure, before any
        was seen), else the dearest parameter's warm switch."""
        if self.relaunch_obs:
            return statistics.median(self.relaunch_obs)
        warm = [s for obs in self.warm_obs.values() for s in obs]
        warm += [s for (_, cached), obs in self.redo_obs.items() if cached for s in obs]
        if warm:
            return statistics.median(warm)
        return max((self._param_s(i, True) for i in changed), default=0.0)

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
        # a knob's own positive prior is a claim about that knob; its class's default, or an own 0
        # (a table that gives its seconds itself), yields to what this run measured for the class (on
        # the H200 Triton compiles took 5-13 s against the default 20 s)
        cls_seen = self.class_obs.get(self.params[i].restart_class.value)
        p = self.params[i]
        if p.own_prior and p.prior_s > 0:
            return p.prior_s * self.pace()
        return statistics.median(cls_seen) if cls_seen else p.prior_s

    def pace(self) -> float:
        """This machine's seconds over the space file's, read off the worker starts measured (a start
        and a compile are both the host's work): the priors were written on one machine, and a run on
        another scales them until its own switches are measured (on an H100 whose host started a
        worker in 5.8 s against the prior's 20 s, the first step compile took 48 s against its 150 s
        prior: benchmarks/results/h100_live_10m)."""
        if not self.start_obs or self.restart_prior_s <= 0:
            return 1.0
        return statistics.median(self.start_obs) / self.restart_prior_s

    def warm_fraction(self) -> float:
        """Warm over cold seconds, from the parameters measured both ways (WARM_FRACTION before)."""
        ratios = [statistics.median(w) / statistics.median(self.param_obs[i]) for i, w in self.warm_obs.items()
                  if self.param_obs.get(i) and statistics.median(self.param_obs[i]) > 0]
        return min(1.0, statistics.median(ratios)) if ratios else WARM_FRACTION


def _relaunch(t: Any) -> bool:
    """Nothing known runs, but the target's process has built before and lives on (its "rebuild").
    With nothing built any other transition is a fresh start; a target that knows its seconds (a
    recorded table) gives them itself."""
    return getattr(t, "restart_class", None) == RestartClass.REBUILD.value and getattr(t, "known_s", None) is None


def _warm_relaunch(t: Any) -> bool:
    """A relaunch whose process is warm for the configuration (the target's `cached`)."""
    return _relaunch(t) and bool(getattr(t, "cached", False))
