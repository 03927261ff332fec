"""The search loop: propose (strategy) -> afford? (budget) -> evaluate (target) -> record (store) -> stop.

    loop = SearchLoop(store, target, space, strategy, budget, LoopSettings(study_name="s"))
    result = loop.run()            # RunResult: trials, best, stop reason, exit code

Order of work in one run: the baseline (trial 0, when the study has none), then configurations
whose trials a killed or interrupted process left unfinished (re-run first, as on resume), then the
strategy's proposals until the strategy stops, `max_trials` is reached or the next trial's expected
cost no longer fits the budget; finally the best is re-measured from the reserve (source "confirm").

Every trial is recorded in the store before it starts (RUNNING) and when it ends, so `kill -9` at any
moment loses nothing that finished. Ctrl-C (SIGINT) while measuring records the running trial as
interrupted and ends the run (exit 130); Ctrl-C between trials stops before the next one.
"""
from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field
from typing import Any

from autoopt.budget import Budget, CostEstimator
from autoopt.live_view import NullObserver
from autoopt.results import Measurement
from autoopt.strategy import Decision, SearchContext, Stop, TrialOutcome
from autoopt.targets.base import EvalRequest

EXIT_OK, EXIT_ALL_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
_APPLY_PHASES = ("restart", "build", "compile")


@dataclass
class LoopSettings:
    study_name: str
    max_trials: int | None = None  # search trials of this run (baseline and re-runs included)
    confirm: bool = True  # re-measure the best at the end, from the reserve
    reserve_max_fraction: float = 0.25  # the reserve never exceeds this share of the budget
    propose_retries: int = 3  # proposals that do not fit the budget before stopping
    give_up_after_failures: int = 5  # stop when this many trials failed and none ever succeeded
    abort_losers: bool = True  # stop sampling a config once its CI top is under the incumbent
    handle_sigint: bool = True


@dataclass
class RunResult:
    run_id: int
    study_name: str
    state: str  # finished | failed | interrupted
    stop_reason: str
    exit_code: int
    trials: list[TrialOutcome] = field(default_factory=list)  # evaluated by this run, in order
    history: list[TrialOutcome] = field(default_factory=list)  # the whole study (finished trials)
    best: TrialOutcome | None = None
    baseline: TrialOutcome | None = None
    confirmation: TrialOutcome | None = None
    elapsed_s: float = 0.0


def outcome_from_record(rec: Any) -> TrialOutcome:
    """A stored TrialRecord as strategies see it."""
    m = rec.measurement
    if m is None:
        kind = "interrupted" if rec.state == "interrupted" else "exception"
        m = Measurement.failed(dict(rec.config or {}), kind, "no measurement recorded")
    costs = m.costs_s or {}
    extra = rec.extra or {}
    transition_s = float(extra.get("transition_s", sum(costs.get(k, 0.0) for k in _APPLY_PHASES)))
    cost_s = float(extra.get("cost_s", costs.get("total", rec.duration_s or 0.0)))
    d = rec.decision or {}
    decision = Decision(params=dict(rec.params), source=d.get("source") or "unknown",
                        reason=d.get("reason") or "", expected_gain=d.get("expected_gain"),
                        expected_gain_sd=d.get("expected_gain_sd"), expected_cost_s=d.get("expected_cost_s"),
                        extra=dict(d.get("extra") or {}))
    ci = rec.objective_ci or (tuple(extra["objective_ci"]) if extra.get("objective_ci") else None)
    diag = extra.get("diagnosis")
    diag = diag.get("verdict") if isinstance(diag, dict) else diag
    return TrialOutcome(number=rec.number, params=dict(rec.params), measurement=m,
                        objective=rec.objective if rec.state == "ok" else None, objective_ci=ci,
                        cost_s=cost_s, transition_s=transition_s, decision=decision,
                        diagnosis=diag if isinstance(diag, str) and diag else None)


def diagnosis_detail(found: Any) -> dict[str, Any] | None:
    """What a strategy's `diagnose()` returned, as the dict stored in extra["diagnosis"]:
    {"verdict": line, "against": parent trial number | None, ...the strategy's own fields}."""
    if found is None:
        return None
    if isinstance(found, str):
        detail: dict[str, Any] = {"verdict": found}
    elif isinstance(found, dict):
        detail = dict(found)
    elif hasattr(found, "to_dict"):
        detail = dict(found.to_dict())
    else:
        detail = dict(vars(found))
    line = detail.pop("line", None) or detail.get("verdict")
    if not isinstance(line, str) or not line.strip():
        return None
    detail["verdict"] = line.strip()
    against = detail.get("against", detail.get("parent"))
    detail["against"] = int(against) if isinstance(against, (int, float)) else None
    return detail


def _interrupted(rec: Any) -> bool:
    return rec.state == "interrupted" or (rec.failure is not None and rec.failure.kind == "interrupted")


class SearchLoop:
    def __init__(self, store: Any, target: Any, space: Any, strategy: Any, budget: Budget,
                 settings: LoopSettings, observer: Any = None, run_id: int | None = None) -> None:
        self.store, self.target, self.space, self.strategy = store, target, space, strategy
        self.budget, self.settings = budget, settings
        self.observer = observer or NullObserver()
        self.run_id = run_id
        self.costs = CostEstimator(default_measure_s=min(60.0, 0.1 * budget.total_s))
        self.history: list[TrialOutcome] = []
        self.trials: list[TrialOutcome] = []
        self.built_params: dict[str, Any] | None = None
        self._measuring = False
        self._stop_requested = False

    # ---- the run -------------------------------------------------------------------------------
    def run(self) -> RunResult:
        self.budget.start()
        study = self.settings.study_name
        state, stop_reason, exit_code = "finished", "", EXIT_OK
        old_handler = self._install_sigint()
        hook = getattr(self.target, "set_phase_callback", None)
        if callable(hook):  # restart / build / compile / warm-up / measure, as the target reports them
            hook(self.observer.phase)
        try:
            queue = self._resume_queue()
            self.observer.run_started(self.space, self.budget, len(self.history), study)
            search_count = 0
            retries = 0
            while True:
                why = self._why_stop(search_count)
                if why:
                    stop_reason = why
                    break
                if not queue:
                    self._refresh_history()  # trials other processes finished on this study meanwhile
                decision = queue.pop(0) if queue else self.strategy.propose(self._context())
                if isinstance(decision, Stop):
                    stop_reason = f"strategy stopped: {decision.reason}"
                    break
                config = self.space.params_to_config(decision.params)
                restart_class, expected = self._expected_cost(config)
                decision.expected_cost_s = expected if decision.expected_cost_s is None else decision.expected_cost_s
                if not self.budget.can_afford(expected, use_reserve=not self.trials):
                    retries += 1
                    if retries >= self.settings.propose_retries or decision.source in ("baseline", "resume"):
                        stop_reason = f"budget: {self.budget.why_not(expected)}"
                        break
                    continue
                retries = 0
                self._evaluate(decision, config, restart_class)
                search_count += 1
                self._set_reserve()  # re-estimated as the costs are learned
            if self.settings.confirm:
                self._confirm()
        except KeyboardInterrupt:
            state, exit_code = "interrupted", EXIT_INTERRUPTED
            stop_reason = "interrupted by Ctrl-C (SIGINT)"
        finally:
            self._restore_sigint(old_handler)
        if state != "interrupted":
            if self._stop_requested:
                state, exit_code = "interrupted", EXIT_INTERRUPTED
                stop_reason = "interrupted by Ctrl-C (SIGINT) between trials"
            elif self.trials and all(t.objective is None for t in self.trials):
                state, exit_code = "failed", EXIT_ALL_FAILED
                stop_reason = f"every trial of this run failed; {stop_reason}"
        self.store.finish_run(self.run_id, state, stop_reason)
        result = RunResult(run_id=self.run_id, study_name=study, state=state, stop_reason=stop_reason,
                           exit_code=exit_code, trials=list(self.trials), history=list(self.history),
                           best=self._best(), baseline=self._baseline(),
                           confirmation=next((t for t in reversed(self.trials)
                                              if t.decision and t.decision.source == "confirm"), None),
                           elapsed_s=self.budget.elapsed_s)
        self.observer.run_finished(result)
        return result

    def _why_stop(self, search_count: int) -> str | None:
        if self._stop_requested:
            return "interrupted by Ctrl-C (SIGINT) between trials"
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
    def _resume_queue(self) -> list[Decision]:
        """Load the study's history; queue the baseline (if missing) and interrupted trials."""
        study = self.settings.study_name
        self.store.mark_interrupted(study)
        records = self.store.trials(study)
        rerun_of = {r.decision.get("extra", {}).get("rerun_of") for r in records if r.decision}
        done = [r for r in records if r.state in ("ok", "wrong", "failed") and not _interrupted(r)]
        done.sort(key=lambda r: (not (r.is_baseline and r.state == "ok"), r.number))  # baseline first
        self.history = [outcome_from_record(r) for r in done]
        for t in self.history:
            if t.objective is not None:
                self.costs.observe_measure(max(0.0, t.cost_s - t.transition_s))
        queue: list[Decision] = []
        has_baseline = any(r.is_baseline and r.state == "ok" for r in done)  # a failed one is retried
        if not has_baseline:
            queue.append(Decision(params=self.space.baseline_params(), source="baseline",
                                  reason="trial 0: the starting point every speed-up is relative to"))
        for r in records:
            if not _interrupted(r) or r.number in rerun_of:
                continue
            if r.is_baseline and not has_baseline:
                queue[0].extra["rerun_of"] = r.number
                continue
            if not self.space.is_feasible(r.params):
                continue  # recorded under another version of the space file
            queue.append(Decision(params=dict(r.params), source="resume",
                                  reason=f"re-run of trial #{r.number}, interrupted before it finished",
                                  extra={"rerun_of": r.number}))
        return queue

    def _refresh_history(self) -> None:
        known = {t.number for t in self.history} | {t.number for t in self.trials}
        fresh = [r for r in self.store.trials(self.settings.study_name, ("ok", "wrong", "failed"),
                                              with_samples=False)
                 if r.number not in known and not _interrupted(r)]
        self.history.extend(outcome_from_record(r) for r in fresh)

    # ---- one trial -----------------------------------------------------------------------------
    def _context(self) -> SearchContext:
        return SearchContext(space=self.space, target=self.target, history=list(self.history),
                             budget_left_s=self.budget.left_s, reserve_s=self.budget.reserve_s,
                             built_params=self.built_params,
                             objective_name=self.space.objective.describe())

    def _expected_cost(self, config: dict[str, Any]) -> tuple[str, float]:
        tr = self.target.transition(config)
        declared = tr.expected_s if not tr.cached else 0.0
        return tr.restart_class, self.costs.expected_trial_s(tr.restart_class, declared)

    def _evaluate(self, decision: Decision, config: dict[str, Any], restart_class: str) -> TrialOutcome:
        handle = self.store.begin_trial(self.run_id, self.settings.study_name, decision.params, config,
                                        decision, distributions=self.space.distributions())
        self.observer.trial_started(handle.number, decision, restart_class)
        ms = self.space.measurement
        request = EvalRequest(config=config, concurrency=tuple(self.space.concurrency),
                              profile=bool(decision.extra.get("profile")),
                              min_samples=ms["min_samples"], max_samples=ms["max_samples"],
                              time_limit_s=float(ms["time_limit_s"]), extra=self._abort_below(decision))
        t0 = self.target.now()
        try:
            self._measuring = True
            if self._stop_requested:  # Ctrl-C came while the trial was being recorded as started
                raise KeyboardInterrupt
            m = self.target.evaluate(request)
            self._measuring = False
        except KeyboardInterrupt:
            self._measuring = False
            m = Measurement.failed(config, "interrupted", "stopped by Ctrl-C (SIGINT) while measuring",
                                   costs_s={"total": self.target.now() - t0})
            self.store.finish_trial(handle, m, None, {"cost_s": self.target.now() - t0})
            raise
        transition_s = sum(m.costs_s.get(k, 0.0) for k in _APPLY_PHASES)
        measured_s = sum(v for k, v in m.costs_s.items() if k not in _APPLY_PHASES and k != "total")
        # A worker the target started before this trial (to describe the device) is charged to it as
        # its restart: count it, or cost - transition would leave nothing for the measurement.
        cost_s = max(self.target.now() - t0, transition_s + measured_s)
        objective = self.space.objective.value(m)
        ci = self.space.objective.ci(m)
        extra: dict[str, Any] = {"cost_s": cost_s, "transition_s": transition_s,
                                 "restart_class": restart_class,
                                 "objective_text": self.space.objective.describe()}
        if ci is not None:
            extra["objective_ci"] = list(ci)
        if len(self.space.objective.weights) == 1:
            extra["objective_name"] = f"tok_per_s@{next(iter(self.space.objective.weights))}"
        base = self._baseline()
        if objective is not None and base is not None and base.objective:
            extra["speedup"] = objective / base.objective
        if m.status == "ok":
            self.costs.observe(restart_class, transition_s, max(0.0, cost_s - transition_s))
            self.built_params = dict(decision.params)
        outcome = TrialOutcome(number=handle.number, params=dict(decision.params), measurement=m,
                               objective=objective, objective_ci=ci, cost_s=cost_s,
                               transition_s=transition_s, decision=decision)
        try:  # pure: explains the outcome before it is stored with it
            detail = self._diagnose(outcome)
        except BaseException:  # a strategy error must not lose the measurement
            self.store.finish_trial(handle, m, objective, extra)
            raise
        if detail is not None:
            outcome.diagnosis = detail["verdict"]
            extra["diagnosis"] = detail  # the store also writes it to the diagnoses table
            if detail.get("against") is not None:
                extra["incumbent_number"] = detail["against"]
            for key in ("predicted_gain", "actual_gain"):
                if isinstance(detail.get(key), (int, float)):
                    extra[key] = detail[key]
        self.store.finish_trial(handle, m, objective, extra)
        if decision.source != "confirm":
            self.history.append(outcome)
        self.trials.append(outcome)
        self.strategy.observe(outcome, self._context())
        self.observer.trial_finished(outcome, self._best(), self._baseline(), self.budget)
        return outcome

    def _diagnose(self, outcome: TrialOutcome) -> dict[str, Any] | None:
        """The strategy's diagnosis of `outcome` (its `diagnose(outcome, history)`, when it has one),
        as stored in extra["diagnosis"]. The baseline has nothing to be compared with."""
        fn = getattr(self.strategy, "diagnose", None)
        if not callable(fn) or (outcome.decision is not None and outcome.decision.source == "baseline"):
            return None
        return diagnosis_detail(fn(outcome, list(self.history)))

    def _abort_below(self, decision: Decision) -> dict[str, Any]:
        """Early abort of clear losers: only for search trials against a single-concurrency objective."""
        inc = self._working_incumbent()
        weights = self.space.objective.weights
        if (not self.settings.abort_losers or inc is None or len(weights) != 1
                or decision.source in ("baseline", "resume", "confirm") or decision.extra.get("profile")):
            return {}
        c = str(next(iter(weights)))
        tp = inc.measurement.tok_per_s.get(c)
        return {"abort_below": {c: tp.median}} if tp is not None else {}

    # ---- incumbent and the final confirmation --------------------------------------------------
    def _baseline(self) -> TrialOutcome | None:
        for t in self.history:
            if t.decision is not None and t.decision.source == "baseline" and t.objective is not None:
                return t
        return next((t for t in self.history if t.number == 0 and t.objective is not None), None)

    def _best_concurrency(self) -> int:
        """The concurrency `autoopt best` judges at: the objective's, or the heaviest of a mix (the
        run's settings record it as objective_concurrency)."""
        weights = self.space.objective.weights
        return max(weights, key=weights.get)

    def _finished(self) -> list[TrialOutcome]:
        """Every finished trial of the study this loop knows of, confirmations included (as the store
        holds them, which `autoopt best` reads)."""
        return self.history + [t for t in self.trials if t.decision is not None and t.decision.source == "confirm"]

    def _best(self) -> TrialOutcome | None:
        """What the user is told is best: the rule of `autoopt best` (autoopt.store.analysis, db/README
        "Definitions") on the trials of the study: the highest median tok/s at the objective's
        concurrency among trials whose 95% CI low end is above the baseline's CI high end; the baseline
        when none is (or the highest objective measured while there is no baseline)."""
        from autoopt.store.analysis import best_outside_noise

        base = self._baseline()
        c = str(self._best_concurrency())
        fig = lambda t: t.measurement.tok_per_s.get(c) if t.objective is not None else None  # noqa: E731
        if base is None or fig(base) is None:
            ok = [t for t in self._finished() if t.objective is not None]
            return max(ok, key=lambda t: t.objective) if ok else None
        cands = [(t, fig(t), t.number) for t in self._finished() if t is not base and fig(t) is not None]
        best, _ = best_outside_noise(cands, fig(base))
        return base if best is None else best

    def _working_incumbent(self) -> TrialOutcome | None:
        """The strategy's own incumbent (`best_params()`: e.g. the agent's best after its repeats),
        its median repeat; else the reported best. Internal only (the early abort of clear losers):
        against a lucky first figure, that abort would cut short configurations as good as the best."""
        pick = self.strategy.best_params() if hasattr(self.strategy, "best_params") else None
        if pick is not None:
            key = self.space.config_key(pick)
            same = sorted((t for t in self.history if t.objective is not None
                           and self.space.config_key(t.params) == key), key=lambda t: t.objective)
            if same:
                return same[(len(same) - 1) // 2]
        return self._best()

    def _set_reserve(self) -> None:
        if not self.settings.confirm:
            return
        # confirming the best may need the dearest transition seen so far, then one measurement
        self.budget.set_reserve(self.costs.expected_measure_s() + self._worst_apply_s(),
                                self.settings.reserve_max_fraction)

    def _worst_apply_s(self) -> float:
        seen = [max(v) for v in self.costs.transition_s.values() if v]
        return max(seen) if seen else 0.0

    def _confirm(self) -> None:
        best, base = self._best(), self._baseline()
        if best is None or self._stop_requested:
            return
        if base is not None and self.space.config_key(best.params) == self.space.config_key(base.params):
            self.observer.note("nothing to confirm: no configuration beat the baseline outside the noise")
            return
        config = self.space.params_to_config(best.params)
        restart_class, expected = self._expected_cost(config)
        if not self.budget.can_afford(expected, use_reserve=True):
            self.observer.note(f"no time left to confirm trial #{best.number}: "
                               f"{self.budget.why_not(expected)}")
            return
        decision = Decision(params=dict(best.params), source="confirm",
                            reason=f"re-measure the best (trial #{best.number}, "
                                   f"{best.objective:.4g} tok/s) to confirm it outside the search",
                            expected_cost_s=expected, extra={"confirms": best.number, "parent": best.number})
        self._evaluate(decision, config, restart_class)

    # ---- Ctrl-C --------------------------------------------------------------------------------
    def _install_sigint(self) -> Any:
        if not self.settings.handle_sigint or threading.current_thread() is not threading.main_thread():
            return None

        def on_sigint(signum: int, frame: Any) -> None:
            if self._measuring or self._stop_requested:
                raise KeyboardInterrupt  # abandon the measurement (a second Ctrl-C: abandon anything)
            self._stop_requested = True
            self.observer.note("Ctrl-C: stopping after the current step (press again to abort)")

        return signal.signal(signal.SIGINT, on_sigint)

    @staticmethod
    def _restore_sigint(old: Any) -> None:
        if old is not None:
            signal.signal(signal.SIGINT, old)
