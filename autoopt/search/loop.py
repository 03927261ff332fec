"""The search loop: propose (strategy) -> afford? (budget, the one cost model) -> claim (no other live
run measures it) -> evaluate (target, in this host's measuring turn) -> record (store) -> stop.

    loop = SearchLoop(store, target, space, strategy, budget, LoopSettings(study_name="s"))
    result = loop.run()            # RunResult: trials, best, stop reason, exit code

Order of work in one run (autoopt.search.resume): this run's baseline, profiled (shared with runs at
work on the study at the same time), then configurations a killed or interrupted process left
unfinished, then the strategy's proposals until it stops, `max_trials` is reached or the next trial's
expected cost no longer fits the budget; finally the best is re-measured from the reserve ("confirm").
Each trial's expected cost is the one cost model's; its result is computed once here (`_result`) and
stored as given, recorded before it starts (RUNNING) and when it ends, so `kill -9` loses nothing that
finished. Ctrl-C, SIGTERM or SIGHUP while measuring records the running trial as interrupted and ends
the run (exit 130, 143, 129); between trials, the run stops before the next one.
"""
from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from typing import Any

from autoopt.measurement import Measurement
from autoopt.search import incumbent, resume, sharing, stop_signals
from autoopt.search.resume import interrupted as _interrupted, outcome_from_record
from autoopt.search.stop_signals import signal_text
from autoopt.search.budget import Budget
from autoopt.search.cost import CostModel
from autoopt.search.observer import NullObserver
from autoopt.search.run_types import (EXIT_ALL_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED,  # noqa: F401
                                      EXIT_OK, LoopSettings, RunResult)
from autoopt.search.strategy import SearchContext, Stop, TrialOutcome
from autoopt.store.analysis import Mix, objective_unit
from autoopt.targets.base import EvalRequest, Transition
from autoopt.trial import APPLY_PHASES, Decision, DecisionSource, Diagnosis, TrialResult, TrialState

_QUEUED = (DecisionSource.BASELINE, DecisionSource.RESUME)  # decisions the loop itself makes first
_TURN_GAP_S = 0.15  # after a measuring turn: three polls of a waiting run (autoopt.store.locks.POLL_S)


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


class SearchLoop:
    def __init__(self, store: Any, target: Any, space: Any, strategy: Any, budget: Budget,
                 settings: LoopSettings, observer: Any = None, run_id: int | None = None) -> None:
        self.store, self.target, self.space, self.strategy = store, target, space, strategy
        self.budget, self.settings = budget, settings
        self.observer = observer or NullObserver()
        self.run_id = run_id
        self.costs = CostModel(space, default_measure_s=min(60.0, 0.1 * budget.total_s))
        self.history: list[TrialOutcome] = []
        self._best_memo: tuple[tuple, TrialOutcome | None] = ((), None)  # (history state, its best)
        self._key = incumbent.objective_key(space)  # what the best is ranked by: a concurrency or the mix
        self.trials: list[TrialOutcome] = []
        self.built_params: dict[str, Any] | None = None  # what the target has built (None: nothing)
        self._measuring = False
        self._stop_requested = False
        self._signal: signal.Signals | None = None  # the stop signal that came, if any
        self._queue: list[Decision] = []
        self._handle: Any = None  # the trial _next_trial claimed, for _evaluate
        self._baseline_number: int | None = None
        self._proposing_since: float | None = None  # target clock when this trial's choice began

    # ---- the run -------------------------------------------------------------------------------
    def run(self) -> RunResult:
        self.budget.start()
        state, exit_code = "finished", EXIT_OK
        old_handler = self._install_sigint()
        hook = getattr(self.target, "set_phase_callback", None)
        if callable(hook):  # restart / build / compile / warm-up / measure, as the target reports them
            hook(self.observer.phase)
        try:
            stop_reason = self._search()
            if self.settings.confirm:
                with self._turn():
                    self._confirm()
        except KeyboardInterrupt:
            state, exit_code = "interrupted", stop_signals.exit_code(self._signal, EXIT_INTERRUPTED)
            stop_reason = f"interrupted by {signal_text(self._signal)}"
        finally:
            stop_signals.restore(old_handler)
        if state != "interrupted":
            if self._stop_requested:
                state, exit_code = "interrupted", stop_signals.exit_code(self._signal, EXIT_INTERRUPTED)
                stop_reason = f"interrupted by {signal_text(self._signal)} between trials"
            elif self.trials and all(t.objective is None for t in self.trials) and self._baseline() is None:
                # beside a run whose shared baseline worked, this run's failures are data (exit 0)
                state, exit_code = "failed", EXIT_ALL_FAILED
                stop_reason = f"every trial of this run failed; {stop_reason}"
        self.store.finish_run(self.run_id, state, stop_reason)
        result = RunResult(run_id=self.run_id, study_name=self.settings.study_name, state=state,
                           stop_reason=stop_reason, exit_code=exit_code, trials=list(self.trials),
                           history=list(self.history), best=self._best(), baseline=self._baseline(),
                           confirmation=next((t for t in reversed(self.trials) if t.decision
                                              and t.decision.kind is DecisionSource.CONFIRM), None),
                           elapsed_s=self.budget.elapsed_s, mix=self._key.text() if isinstance(self._key, Mix) else None)
        self.observer.run_finished(result)
        return result

    def _search(self) -> str:
        """Trials until something says stop; returns why. Each trial is chosen, claimed and measured
        in this host's measuring turn (runs on one host take turns; LoopSettings.measure_lock)."""
        # the study's history (teaching the cost model); the baseline and interrupted trials queued first
        self.history, self._queue = resume.history_and_queue(self.store, self.space, self.settings.study_name,
                                                             self.costs)
        self.observer.run_started(self.space, self.budget, len(self.history), self.settings.study_name)
        search_count = retries = 0
        while True:
            why = self._why_stop(search_count)
            if why:
                return why
            with self._turn():
                step = self._next_trial()
                if isinstance(step, str):
                    return step
                decision, config, transition, busy = step
                if decision is None:  # proposed, but it does not fit the budget
                    retries += 1  # asking again costs the loop's own seconds: not when only they are left
                    if retries >= self.settings.propose_retries or self.budget.spendable_s <= self.costs.loop_s():
                        return f"budget: {self.budget.why_not(transition)}"
                    continue
                retries = 0
                if busy is None:
                    self._evaluate(decision, config, transition.restart_class)
                    search_count += 1
                    self._set_reserve()  # re-estimated as the costs are learned
            if busy is not None:  # another live run is measuring it: wait for its result instead
                self._wait_for(busy, decision)

    def _next_trial(self) -> Any:
        """The next decision, its config, its transition and who else is measuring it (None: nobody,
        and the trial is begun); a str: why the run stops; decision None: it does not fit the budget
        (the transition slot then holds its expected seconds)."""
        self._proposing_since = self.target.now()
        if not self._queue:
            self._refresh_history()  # trials other processes finished on this study meanwhile
        decision = self._queue.pop(0) if self._queue else self.strategy.propose(self._context())
        if isinstance(decision, Stop):
            return f"strategy stopped: {decision.reason}"
        config = self.space.params_to_config(decision.params)
        self._profile_if_new(decision)
        transition = self._estimate(decision, config)
        # a search trial must fit as it may run long (the reserve then stays whole for the confirmation)
        needed_s = self.costs.needed_s(decision.expected_cost_s)
        if not self.budget.can_afford(needed_s, use_reserve=not self.trials):
            if decision.kind in _QUEUED:
                return f"budget: {self.budget.why_not(needed_s)}"
            return None, config, needed_s, None
        return decision, config, transition, self._claim(decision, config)

    def _claim(self, decision: Decision, config: dict[str, Any]) -> Any:
        """Begin the trial (for _evaluate) unless another live run makes it redundant; returns that
        run's trial (None: claimed). One step under the study's claim lock."""
        with self.store.claim(self.settings.study_name, self._stopping):
            busy = sharing.busy_with(self.store, self.space, self.settings.study_name, self.run_id, decision)
            if busy is None:
                self._handle = self.store.begin_trial(self.run_id, self.settings.study_name, decision.params,
                                                      config, decision, distributions=self.space.distributions())
        return busy

    def _why_stop(self, search_count: int) -> str | None:
        if self._stop_requested:
            return f"interrupted by {signal_text(self._signal)} between trials"
        if self.settings.max_trials is not None and search_count >= self.settings.max_trials:
            return f"max trials reached ({self.settings.max_trials})"
        if self.history and self.budget.spendable_s <= 0:
            return "budget spent"
        n = self.settings.give_up_after_failures
        if len(self.trials) >= n and not any(t.objective is not None for t in self.history):
            last = self.trials[-1].measurement.failure
            why = f" (last: {last.kind}: {last.reason.splitlines()[0][:200]})" if last else ""
            return f"the first {len(self.trials)} trials all failed and none ever succeeded{why}"
        return None

    # ---- resume --------------------------------------------------------------------------------
    def _refresh_history(self) -> None:
        known = {t.number for t in self.history} | {t.number for t in self.trials}
        fresh = [outcome_from_record(r) for r in self.store.trials(
            self.settings.study_name, ("ok", "wrong", "failed"), with_samples=False)
            if r.number not in known and not _interrupted(r)]
        for t in fresh:  # measured by another process: its measurement seconds still teach
            self.costs.observe(None, t.params, t.result)
        self.history.extend(fresh)

    # ---- runs at the same time: turns, claims, a shared baseline ------------------------------
    def _stopping(self) -> bool:
        return self._stop_requested

    @contextlib.contextmanager
    def _turn(self) -> Any:
        """This host's measuring turn, and after it a pause longer than a waiter's poll, so that
        the runs waiting take their turns instead of this one taking every turn again."""
        if not self.settings.measure_lock:
            yield
            return
        with self.store.measure_turn(self._stopping):
            yield
        time.sleep(_TURN_GAP_S)

    def _wait_for(self, busy: Any, decision: Decision) -> None:
        """Wait (outside the measuring turn) until the other run's trial ends; a shared baseline that
        succeeded becomes this run's, one that failed is measured here after all."""
        self.observer.note(f"trial #{busy.number} of run {busy.run_id} is measuring "
                           f"{'the baseline' if busy.is_baseline else 'this configuration'}: "
                           "using its result instead of measuring it twice")
        state = sharing.wait_until_done(self.store, self.settings.study_name, busy, self._stopping)
        self._refresh_history()
        if decision.kind is DecisionSource.BASELINE:
            if state == "ok":
                self._baseline_number = busy.number
            else:
                decision.reason = f"the baseline: trial #{busy.number} of run {busy.run_id} did not succeed"
                self._queue.insert(0, decision)

    def _profile_if_new(self, decision: Decision) -> None:
        """Profile every configuration the first time the study measures it, the baseline in every
        run, and every repeat (a re-measured incumbent becomes the parent later trials are diagnosed
        against): a diagnosis reads the buckets of both sides, the trial's and its parent's."""
        decision.profile = decision.profile or decision.kind in (DecisionSource.BASELINE, DecisionSource.REPEAT) \
            or not incumbent.profiled_before(self.space, self.history, decision.params)

    # ---- one trial -----------------------------------------------------------------------------
    def _context(self) -> SearchContext:
        return SearchContext(space=self.space, target=self.target, history=list(self.history),
                             budget_left_s=self.budget.left_s, reserve_s=self.budget.reserve_s, costs=self.costs,
                             built_params=self.built_params, objective_name=self.space.objective.describe())

    def _estimate(self, decision: Decision, config: dict[str, Any]) -> Transition:
        """Set the decision's one cost estimate (the target's facts, the model's seconds); the facts."""
        transition = self.target.transition(config)
        decision.expected_cost = self.costs.estimate(self.built_params, decision.params, transition)
        return transition

    def _evaluate(self, decision: Decision, config: dict[str, Any], restart_class: str) -> TrialOutcome:
        handle, self._handle = self._handle, None
        if handle is None:  # not claimed by _next_trial (the final confirmation)
            handle = self.store.begin_trial(self.run_id, self.settings.study_name, decision.params, config,
                                            decision, distributions=self.space.distributions())
        self.observer.trial_started(handle.number, decision, restart_class)
        t0 = self.target.now()
        m = self._measure(handle, decision, config, t0)
        measured_at = self.target.now()
        outcome = TrialOutcome(number=handle.number, params=dict(decision.params), measurement=m,
                               result=self._result(m, restart_class, t0), decision=decision)
        try:  # pure: explains the outcome before it is stored with it
            outcome.result.diagnosis = self._diagnose(outcome)
        except BaseException:  # a strategy error must not lose the measurement
            self.store.finish_trial(handle, m, outcome.result)
            raise
        self.store.finish_trial(handle, m, outcome.result)
        self.costs.observe(self.built_params, decision.params, outcome.result, decision.expected_cost)
        self.built_params = dict(decision.params) if outcome.result.ok else None
        if decision.kind is DecisionSource.BASELINE and outcome.result.ok:
            self._baseline_number = handle.number  # this session's baseline, every speed-up's base
        if decision.kind is not DecisionSource.CONFIRM:
            self.history.append(outcome)
        self.trials.append(outcome)
        self.strategy.observe(outcome, self._context())
        self.observer.trial_finished(outcome, self._best(), self._baseline(), self.budget)
        # the loop's own seconds around the measurement (choosing, recording, explaining; 0.25 s a
        # trial on the CPU's 2-minute run, where trials that did not budget them ate the reserve)
        chose_s = t0 - self._proposing_since if self._proposing_since is not None else 0.0
        self.costs.observe_loop(chose_s + self.target.now() - measured_at)
        self._proposing_since = None
        return outcome

    def _measure(self, handle: Any, decision: Decision, config: dict[str, Any], t0: float) -> Measurement:
        """The target's measurement; Ctrl-C while measuring stores the trial interrupted and ends the run."""
        ms = self.space.measurement
        request = EvalRequest(config=config, concurrency=tuple(self.space.concurrency),
                              profile=decision.profile, min_samples=ms["min_samples"],
                              max_samples=ms["max_samples"], time_limit_s=float(ms["time_limit_s"]),
                              extra={**self._abort_below(decision), "processes": int(ms.get("processes", 1))})
        try:
            self._measuring = True
            if self._stop_requested:  # Ctrl-C came while the trial was being recorded as started
                raise KeyboardInterrupt
            return self.target.evaluate(request)
        except KeyboardInterrupt:
            cost_s = self.target.now() - t0
            m = Measurement.failed(config, "interrupted", f"stopped by {signal_text(self._signal)} while measuring",
                                   costs_s={"total": cost_s})
            self.store.finish_trial(handle, m, TrialResult(TrialState.INTERRUPTED.value, None, cost_s=cost_s))
            raise
        finally:
            self._measuring = False

    def _result(self, m: Measurement, restart_class: str, t0: float) -> TrialResult:
        """What the measurement means for the search, computed once (the store writes it as given)."""
        transition_s = sum(m.costs_s.get(k, 0.0) for k in APPLY_PHASES)
        measured_s = sum(v for k, v in m.costs_s.items() if k not in APPLY_PHASES and k != "total")
        ok = m.status == TrialState.OK
        objective = _finite(self.space.objective.value(m)) if ok else None
        weights = self.space.objective.weights
        base = self._baseline()
        return TrialResult(
            state=TrialState.INTERRUPTED.value if m.failure is not None and m.failure.kind == "interrupted"
            else m.status,
            objective=objective, objective_ci=self.space.objective.ci(m) if objective is not None else None,
            objective_name=f"tok_per_s@{next(iter(weights))}" if len(weights) == 1 else None,
            objective_text=self.space.objective.describe(),
            # A worker the target started before this trial (to describe the device) is charged to it
            # as its restart: count it, or cost - transition would leave nothing for the measurement.
            cost_s=max(self.target.now() - t0, transition_s + measured_s), transition_s=transition_s,
            restart_class=restart_class,
            speedup=objective / base.objective if objective is not None and base is not None
            and base.objective else None)

    def _diagnose(self, outcome: TrialOutcome) -> Diagnosis | None:
        """The strategy's diagnosis of `outcome` (its `diagnose(outcome, history)`, when it has one).
        The baseline has nothing to be compared with."""
        fn = getattr(self.strategy, "diagnose", None)
        if not callable(fn) or (outcome.decision is not None and outcome.decision.kind is DecisionSource.BASELINE):
            return None
        found = fn(outcome, list(self.history))
        return found if isinstance(found, Diagnosis) and found.verdict.strip() else None

    def _abort_below(self, decision: Decision) -> dict[str, Any]:
        inc = incumbent.working_incumbent(self.strategy, self.space, self.history, self._best())
        search = decision.kind not in (*_QUEUED, DecisionSource.CONFIRM)
        return incumbent.abort_below(inc, self.space, self.settings.abort_losers and search)

    # ---- the best and the final confirmation ---------------------------------------------------
    def _baseline(self) -> TrialOutcome | None:
        """This session's baseline (measured by this run, or shared with a run at work beside it)."""
        return incumbent.baseline_of(self.history, self._baseline_number)

    def _best(self) -> TrialOutcome | None:
        """The rule of `autoopt best` on every finished trial this loop knows of, confirmations
        included (as the store holds them), on the space's objective (a concurrency or the mix)."""
        state = (id(self.history), len(self.history), len(self.trials), self._baseline_number)
        if self._best_memo[0] == state:  # asked ~3 times a trial
            return self._best_memo[1]
        finished = self.history + [t for t in self.trials
                                   if t.decision is not None and t.decision.kind is DecisionSource.CONFIRM]
        base = self._baseline()
        if base is not None:  # only figures of this session are compared with its baseline
            finished = [t for t in finished if t.number >= base.number]
        best = incumbent.best_of(finished, base, self._key)
        self._best_memo = (state, best)
        return best

    def _set_reserve(self) -> None:
        """Keep back what confirming the best will cost from where the next trial leaves the worker."""
        if not self.settings.confirm:
            return
        best = self._best()
        facts = None
        if best is not None and self.built_params is not None:
            facts = self.target.transition(self.space.params_to_config(best.params))
        reserve = self.costs.confirm_reserve_s(self.built_params, best.params if best is not None else None, facts)
        reserve += self.costs.loop_s()
        self.budget.set_reserve(reserve, self.settings.reserve_max_fraction)

    def _confirm(self) -> None:
        best, base = self._best(), self._baseline()
        if best is None or self._stop_requested:
            return
        if base is not None and self.space.config_key(best.params) == self.space.config_key(base.params):
            self.observer.note("nothing to confirm: no configuration beat the baseline outside the noise")
            return
        config = self.space.params_to_config(best.params)
        unit = objective_unit([best])  # a replayed time shown in ms, not its reciprocal as "tok/s"
        shown = unit.value({"median": best.objective, "ci_low": best.objective, "ci_high": best.objective})
        decision = Decision(params=dict(best.params), source=DecisionSource.CONFIRM.value,
                            reason=f"re-measure the best (trial #{best.number}, {shown['median']:.4g} "
                                   f"{unit.unit or unit.quantity}) to confirm it outside the search",
                            confirms=best.number, parent=best.number)
        transition = self._estimate(decision, config)
        needed_s = decision.expected_cost_s + self.costs.loop_s()
        if not self.budget.can_afford(needed_s, use_reserve=True):
            self.observer.note(f"no time left to confirm trial #{best.number}: {self.budget.why_not(needed_s)}")
            return
        busy = self._claim(decision, config)
        if busy is not None:
            self.observer.note(f"not confirming trial #{best.number}: trial #{busy.number} of run "
                               f"{busy.run_id} is measuring that configuration now")
            return
        self._evaluate(decision, config, transition.restart_class)

    # ---- Ctrl-C, SIGTERM, SIGHUP ---------------------------------------------------------------
    def _install_sigint(self) -> Any:
        """SIGINT, SIGTERM and SIGHUP alike (autoopt.search.stop_signals): while measuring, the trial
        is abandoned and recorded interrupted; between trials, the run stops before the next one."""
        if not self.settings.handle_sigint or threading.current_thread() is not threading.main_thread():
            return None

        def on_signal(sig: signal.Signals) -> None:
            self._signal = self._signal or sig
            if self._measuring or self._stop_requested:
                raise KeyboardInterrupt  # abandon the measurement (a second signal: abandon anything)
            self._stop_requested = True
            self.observer.note(f"{signal_text(self._signal)}: stopping after the current step "
                               "(press Ctrl-C again to abort)")

        return stop_signals.install(on_signal)
