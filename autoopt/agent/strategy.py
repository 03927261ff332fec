"""AgentStrategy: the cost-aware, profile-guided agent behind `autoopt run --strategy agent`.

One proposal:
  1. catch up with the history: pooled repeats (noise), bucket effects (profiles), apply costs
     (transitions), failure odds, the GP on log(objective / baseline);
  2. if a challenger measured better than the incumbent but inside the noise, re-measure the two,
     interleaved, until it separates or is a tie (autoopt.agent.noise);
  3. otherwise gather candidates (sampler, profile moves, cheap neighbours: autoopt.agent.propose),
     score each by expected gain ± sd per second of transition + measurement from what is built now,
     batching a build's runtime variants (autoopt.agent.choose);
  4. stop when the best is not worth its cost, or does not fit the budget with the final
     confirmation (autoopt.agent.stop); else return it with its source, reason, expected gain ± sd and
     expected cost.
After each trial, `diagnose` gives a one-line diagnosis: predicted vs measured gain and the bucket diff
against its parent (autoopt.agent.diagnosis); the loop calls it before it stores the trial and stores
the line with it. `observe` keeps them by trial number in `diagnoses`.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from autoopt.agent.buckets import BucketModel
from autoopt.agent.choose import Chooser
from autoopt.agent.failure import FailureModel
from autoopt.agent.cost import CostModel
from autoopt.agent.diagnosis import TrialDiagnosis, diagnose_trial
from autoopt.agent.model import GainModel
from autoopt.agent.noise import NoiseTracker, measurement_sd
from autoopt.agent.propose import Proposer
from autoopt.agent.stop import StopRule, fmt_gain
from autoopt.agent.view import SpaceView
from autoopt.strategy import Decision, SearchContext, Stop, TrialOutcome

Key = tuple[int, ...]
MODEL_Z = 3.0  # a model-based win must clear more sds than a direct one (the model can be wrong)
MATERIAL_LEAD = 0.02  # a challenger leading by this much is settled now; smaller leads before stopping


class AgentStrategy:
    name = "agent"

    def __init__(self, space: Any, seed: int | None = None, min_gain: str | None = None,
                 sampler: str = "tpe", max_repeats: int = 6, use_priors: bool = True) -> None:
        self.space = space
        self.seed = 0 if seed is None else int(seed)
        self.view = SpaceView(space)
        if not use_priors:  # an ablation: learn every bucket effect from scratch
            self.view.params = [replace(p, prior_speedup={}) for p in self.view.params]
        self.stop_rule = StopRule(min_gain)
        self.noise = NoiseTracker(max_repeats=max_repeats)
        self.buckets = BucketModel(self.view)
        self.model = GainModel(self.view, self.buckets)
        self.costs = CostModel(self.view)
        self.failures = FailureModel(self.view)
        self.proposer = Proposer(self.view, sampler=sampler, seed=self.seed)
        self.chooser = Chooser(self.view, self.model, self.costs, self.failures)
        self.diagnoses: dict[int, TrialDiagnosis] = {}
        self.notes: list[str] = []  # wins, ties and losses, for the run log
        self._reset()

    def _reset(self) -> None:
        self._synced: list[int] = []  # trial numbers processed, in history order
        self._rows: list[tuple[np.ndarray, float, float]] = []  # (code, log objective, sd)
        self._trials: list[tuple[np.ndarray, float | None]] = []  # for the sampler mirror
        self._evaluated: set[Key] = set()
        self._latest: dict[Key, TrialOutcome] = {}  # the last measured outcome of each config
        self._built: np.ndarray | None = None
        self.best_key: Key | None = None
        self.pending: Key | None = None  # a challenger whose lead is still inside the noise
        self._settled: set[Key] = set()  # challengers that lost or tied after repeats
        self._ref_log: float | None = None  # log objective of the baseline (all y are relative)

    # ---- the Strategy protocol -------------------------------------------------------------------
    def propose(self, ctx: SearchContext) -> Decision | Stop:
        self._sync(ctx.history)
        if not ctx.history or self.best_key is None:
            if any(t.objective is not None for t in ctx.history) or len(ctx.history) >= 3:
                return Stop("the baseline cannot be measured: nothing to compare candidates with")
            return Decision(params=self.space.baseline_params(), source="baseline",
                            reason="trial 0: the starting point every speed-up is relative to",
                            extra={"profile": True})
        built = self._built_code(ctx)
        self._fit()
        f_best, ranked_keys, lead = self._incumbent_level()
        search_key = ranked_keys[0]
        self._challenge(search_key)
        if self.pending is not None and lead >= MATERIAL_LEAD:
            repeat = self._repeat_decision(ctx, built, "")
            if repeat is not None:
                return repeat
        inc_code = np.array(search_key)
        inc = self._latest[search_key]
        cands = self.proposer.candidates(self._trials, inc_code, inc.measurement.buckets_ms or {}, built,
                                         [np.array(k) for k in ranked_keys[1:4]], self.buckets, self._evaluated)
        ranked = self.chooser.rank(cands, inc_code, f_best, built, self._transition_of(ctx), self._evaluated,
                                   inc.measurement.buckets_ms or {})
        pick, why = self.stop_rule.check(ranked, ctx.budget_left_s, ctx.reserve_s, n_measured=len(self._evaluated))
        if pick is None:
            if self.pending is not None:  # settle the challenger before handing over the best
                repeat = self._repeat_decision(ctx, built, "before stopping: ")
                if repeat is not None:
                    return repeat
            return Stop(why)
        return self._decision(pick, inc, ctx, note=why)

    def observe(self, outcome: TrialOutcome, ctx: SearchContext) -> None:
        self.diagnoses[outcome.number] = self.diagnose(outcome, ctx.history)
        self._sync(ctx.history)

    def diagnose(self, outcome: TrialOutcome, history: list[TrialOutcome]) -> TrialDiagnosis:
        """Predicted vs measured gain and the bucket diff against the trial's parent (pure: a loop
        may call it before recording the trial, to store the line with it)."""
        parent_no = outcome.decision.extra.get("parent") if outcome.decision is not None else None
        parent = next((t for t in history if t.number == parent_no), None) if parent_no is not None else None
        return diagnose_trial(outcome, parent)

    # ---- what the agent believes -----------------------------------------------------------------
    def best_params(self) -> dict[str, Any] | None:
        """The incumbent: the best configuration whose win was outside the noise."""
        return self.view.decode(np.array(self.best_key)) if self.best_key is not None else None

    @property
    def last_diagnosis(self) -> str | None:
        return self.diagnoses[max(self.diagnoses)].line if self.diagnoses else None

    # ---- catching up with the history ------------------------------------------------------------
    def _sync(self, history: list[TrialOutcome]) -> None:
        numbers = [t.number for t in history]
        if numbers[:len(self._synced)] != self._synced:
            self._reset()  # the history is not an extension of what was seen: start over
        for t in history[len(self._synced):]:
            self._add(t)
            self._synced.append(t.number)
        self._resolve_pending()

    def _add(self, t: TrialOutcome) -> None:
        code = self.view.encode(t.params)
        if code is None:
            return  # recorded under another version of the space
        key: Key = tuple(int(c) for c in code)
        ok = t.objective is not None and t.objective > 0
        extra = t.decision.extra if t.decision is not None else {}
        self.costs.observe(self._built, code, t.transition_s,
                           max(0.0, t.cost_s - t.transition_s) if ok else 0.0,
                           extra.get("transition_expected_s"), bool(extra.get("cached", False)))
        if key not in self._evaluated:
            self.failures.add(code, failed=not ok)
        self._evaluated.add(key)
        if not ok:
            self._trials.append((code, None))
            self._built = None
            return
        if self._ref_log is None:
            self._ref_log = math.log(t.objective)
        self.noise.add(key, t.objective, t.objective_ci)
        y = math.log(t.objective) - self._ref_log
        self._rows.append((code, y, measurement_sd(t.objective, t.objective_ci)))
        self._trials.append((code, y))
        self._latest[key] = t
        self.buckets.add(code, t.measurement.buckets_ms or {}, is_baseline=self.best_key is None,
                         coverage=t.measurement.bucket_coverage)
        self._built = code
        if self.best_key is None:
            self.best_key = key
        elif key != self.best_key:
            self._settled.discard(key)  # new evidence: it may challenge again
            if self.noise.compare(key, self.best_key)[0] == "win":
                self._crown(key, "measured outside the noise")

    def _challenge(self, key: Key) -> None:
        """The model's best measured configuration challenges the declared best. It wins on its
        repeats (autoopt.agent.noise), or on the model's pooled evidence: its own repeats put it
        ahead and the GP's joint posterior puts it ahead by more than MODEL_Z sds (a small main
        effect confirmed across many pairs of trials, which no handful of repeats of one pair could
        separate from the noise)."""
        if key == self.best_key:
            self.pending = None
            return
        verdict, direct, _ = self.noise.compare(key, self.best_key)
        if verdict != "win" and direct > 0:
            d, sd = self.model.difference(np.array(key), np.array(self.best_key))
            if d > MODEL_Z * sd:
                self._crown(key, f"the model's pooled evidence: {fmt_gain(math.expm1(d), 1.96 * sd)}")
                return
        if key in self._settled:
            self.pending = None
        elif verdict == "win":
            self._crown(key, "measured outside the noise")
        elif verdict == "open":
            self.pending = key
        else:
            self._settled.add(key)
            self.pending = None

    def _resolve_pending(self) -> None:
        if self.pending is None or self.best_key is None:
            return
        verdict, gain, sd = self.noise.compare(self.pending, self.best_key)
        if verdict == "win":
            self._crown(self.pending, f"{fmt_gain(gain, 1.96 * sd)} after repeats")
        elif verdict == "loss":
            self.notes.append(f"{self.view.describe(np.array(self.pending), np.array(self.best_key))}: "
                              f"{fmt_gain(gain, 1.96 * sd)} is inside the noise: not a win, incumbent kept")
            self._settled.add(self.pending)
            self.pending = None

    def _crown(self, key: Key, why: str) -> None:
        self.notes.append(f"new best #{self._latest[key].number}: "
                          f"{self.view.describe(np.array(key), np.array(self.best_key))} ({why})")
        self.best_key, self.pending = key, None

    def _built_code(self, ctx: SearchContext) -> np.ndarray | None:
        if ctx.built_params:
            code = self.view.encode(ctx.built_params)
            if code is not None and self._built is not None:
                return code
        return self._built

    # ---- model -----------------------------------------------------------------------------------
    def _fit(self) -> None:
        X = np.stack([c for c, _, _ in self._rows])
        y = np.array([v for _, v, _ in self._rows])
        sd = np.sqrt(np.array([self.noise.var(s) for _, _, s in self._rows]))
        self.model.fit(X, y, sd)

    def _incumbent_level(self) -> tuple[float, list[Key], float]:
        """The best GP posterior mean among measured configurations, those configurations by it,
        and the model's lead of the best over the declared best (log units)."""
        keys = list(self._latest)
        mu, _ = self.model.predict(np.array(keys))
        order = np.argsort(-mu)
        f_best = float(mu[order[0]])
        return f_best, [keys[i] for i in order], f_best - float(mu[keys.index(self.best_key)])

    def _transition_of(self, ctx: SearchContext) -> Any:
        target = ctx.target
        if target is None or not hasattr(target, "transition"):
            return lambda code: None

        def of(code: np.ndarray) -> Any:
            return target.transition(self.space.params_to_config(self.view.decode(code)))
        return of

    # ---- decisions -------------------------------------------------------------------------------
    def _decision(self, pick: Any, inc: TrialOutcome, ctx: SearchContext, note: str | None = None) -> Decision:
        tr = self._transition_of(ctx)(pick.code)
        batch = f"; opens a build with {pick.batch} cheap runtime variants to try next" if pick.batch else ""
        cand_note = f"{pick.cand.note}; " if pick.cand.note else ""
        reason = (f"{pick.label}: {cand_note}expected {fmt_gain(pick.gain, pick.gain_sd)} "
                  f"(worth {fmt_gain(pick.worth)}) for {pick.cost.text()}{batch}")
        if note:
            reason += f"; {note}"
        if pick.p_fail > 0.1:
            reason += f"; {100 * pick.p_fail:.0f}% odds it fails like similar configurations"
        extra = {"parent": inc.number, "worth": pick.worth, "p_fail": pick.p_fail,
                 "rate_per_10min": pick.rate * 600, "batch": pick.batch,
                 "restart_class": pick.cost.restart_class, "changed": list(pick.cost.changed),
                 "transition_expected_s": getattr(tr, "expected_s", None),
                 "cached": bool(getattr(tr, "cached", False)),
                 "profile": any(not self.buckets.known(p, int(v)) for p, v in enumerate(pick.code)
                                if v != self.view.base_code[p])}
        return Decision(params=self.view.decode(pick.code), source=pick.cand.source, reason=reason,
                        expected_gain=pick.gain, expected_gain_sd=pick.gain_sd,
                        expected_cost_s=pick.cost.total_s, extra=extra)

    def _repeat_decision(self, ctx: SearchContext, built: np.ndarray | None, why: str) -> Decision | None:
        """Re-measure challenger or incumbent while the challenger's lead is inside the noise."""
        if self.pending is None:
            return None
        ch, inc = self.pending, self.best_key
        tr_of = self._transition_of(ctx)
        costs = {k: self.costs.estimate(built, np.array(k), tr_of(np.array(k))) for k in (ch, inc)}
        key = self.noise.next_to_measure(ch, inc, {k: c.total_s for k, c in costs.items()})
        cost = costs[key]
        if cost.total_s > max(0.0, ctx.budget_left_s - ctx.reserve_s):
            self.notes.append("no budget left to settle a challenger inside the noise: incumbent kept")
            self.pending = None
            return None
        _, gain, sd = self.noise.compare(ch, inc)
        who = "challenger" if key == ch else "incumbent"
        reason = (f"{why}re-measure the {who} (challenger: {self.view.describe(np.array(ch), np.array(inc))}): "
                  f"it leads by "
                  f"{fmt_gain(gain, 1.96 * sd)}, inside the noise; a win must clear the noise "
                  f"(n={self.noise.n(ch)} vs {self.noise.n(inc)}; {cost.text()})")
        tr = tr_of(np.array(key))
        return Decision(params=self.view.decode(np.array(key)), source="repeat", reason=reason,
                        expected_gain=None, expected_gain_sd=None, expected_cost_s=cost.total_s,
                        extra={"parent": self._latest[inc].number, "repeat_of": who,
                               "transition_expected_s": getattr(tr, "expected_s", None),
                               "cached": bool(getattr(tr, "cached", False))})

