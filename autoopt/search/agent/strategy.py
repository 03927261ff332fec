"""AgentStrategy: the cost-aware, profile-guided agent behind `autoopt run --strategy agent`.

One proposal:
  1. catch up with the history: pooled repeats (noise), bucket effects (profiles), apply costs
     (transitions), failure odds, the GP on log(objective / baseline);
  2. if a challenger measured better than the incumbent but inside the noise, re-measure the two,
     interleaved, until it separates or is a tie (autoopt.search.agent.noise);
  3. otherwise gather candidates (sampler, profile moves, cheap neighbours: autoopt.search.agent.propose),
     score each by expected gain ± sd per second of transition + measurement from what is built now,
     batching a build's runtime variants (autoopt.search.agent.choose);
  4. stop when the best is not worth its cost, or does not fit the budget with the final confirmation
     (autoopt.search.agent.stop); else return it with its source, reason, expected gain ± sd, cost.
After each trial, `diagnose` gives a one-line diagnosis: predicted vs measured gain and the bucket diff
against its parent (autoopt.search.agent.diagnosis); the loop calls it once, before it stores the trial,
and stores it with the result. `observe` keeps them (from the result) by trial number in `diagnoses`.
Costs are the loop's one cost model (`ctx.costs`, autoopt.search.cost): the agent reads it to rank
candidates and never teaches it (the loop does, once per trial).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from autoopt.search.agent.buckets import BucketModel
from autoopt.search.agent.calibration import Calibration
from autoopt.search.agent.choose import Chooser
from autoopt.search.agent.failure import FailureModel
from autoopt.search.agent.diagnosis import diagnose_trial
from autoopt.search.agent.model import GainModel, expected_improvement
from autoopt.search.agent.noise import NoiseTracker, measurement_sd
from autoopt.search.agent.propose import Candidate, Proposer
from autoopt.search.agent.stop import StopRule, fmt_gain
from autoopt.search.agent.view import SpaceView
from autoopt.search.agent.warmstart import PriorEvidence
from autoopt.search.strategy import Decision, SearchContext, Stop, TrialOutcome
from autoopt.trial import DecisionSource, Diagnosis

Key = tuple[int, ...]
MODEL_Z = 3.0  # a model-based win must clear more sds than a direct one (the model can be wrong)
MATERIAL_LEAD = 0.02  # a challenger leading by this much is settled now; smaller leads before stopping
COVER_MAX_FRACTION = 0.02  # before stopping, an untried one-knob move of the incumbent costing at most
                           # this share of the budget left is tried (nothing cheap and plausible untried)
COVER_MAX_FAIL = 0.5  # ... unless it more likely fails than not
STOP_SD_MARGIN = 2.0  # a stop must hold with every sd this much wider: calibration is measured on what the
# run tried (near its incumbent), not on the regions it left. Six Kernel Tuner landscapes, seeds 100-101, 15 min:
# x1 stopped 9 runs of 12, 2 short of 1% (88.6%, 98.9%); x2 6, all within 1% (committed tables: 17-55% later)


class AgentStrategy:
    name = "agent"

    def __init__(self, space: Any, seed: int | None = None, min_gain: str | None = None,
                 sampler: str = "tpe", max_repeats: int = 6, use_priors: bool = True,
                 warm_start: list[Any] | None = None) -> None:
        self.space = space
        self.seed = 0 if seed is None else int(seed)
        self.view = SpaceView(space)
        if not use_priors:  # an ablation: learn every bucket effect from scratch
            self.view.params = [replace(p, prior_speedup={}) for p in self.view.params]
        self.stop_rule = StopRule(min_gain)
        self.noise = NoiseTracker(max_repeats=max_repeats)
        self.buckets = BucketModel(self.view)
        self.model = GainModel(self.view, self.buckets)
        self.failures = FailureModel(self.view)
        self.proposer = Proposer(self.view, sampler=sampler, seed=self.seed)
        self.chooser = Chooser(self.view, self.model, self.failures)
        self.diagnoses: dict[int, Diagnosis] = {}
        self.notes: list[str] = []  # wins, ties and losses, for the run log
        self.prior: PriorEvidence | None = None
        self._reset()
        if warm_start:
            self.warm_start(warm_start)

    def _reset(self) -> None:
        self._synced: list[int] = []  # trial numbers processed, in history order
        self._rows: list[tuple[np.ndarray, float, float]] = []  # (code, log objective, sd)
        self._trials: list[tuple[np.ndarray, float | None]] = []  # for the sampler mirror
        self._evaluated: set[Key] = set()
        self._latest: dict[Key, TrialOutcome] = {}  # the last measured outcome of each config
        self._row_of: dict[Key, int] = {}  # its row in _rows
        self._built: np.ndarray | None = None
        self.best_key: Key | None = None
        self.pending: Key | None = None  # a challenger whose lead is still inside the noise
        self._settled: set[Key] = set()  # challengers that lost or tied after repeats
        self._ref_log: float | None = None  # log objective of the baseline (all y are relative)
        self.calibration = Calibration()

    def warm_start(self, outcomes: list[Any], source: str = "another study") -> str:
        """Start from another study's measured effects (autoopt.search.agent.warmstart): records or
        outcomes with .params and .objective. Returns the line for the run log."""
        self.prior = PriorEvidence(self.view, outcomes, source=source)
        text = self.prior.text() if len(self.prior) else \
            f"warm start: {source} has no measured baseline to read its gains against: not used"
        if not len(self.prior):
            self.prior = None
        self.notes.append(text)
        return text

    # ---- the Strategy protocol -------------------------------------------------------------------
    def propose(self, ctx: SearchContext) -> Decision | Stop:
        self._sync(ctx.history)
        if not ctx.history or self.best_key is None:
            if any(t.objective is not None for t in ctx.history) or len(ctx.history) >= 3:
                return Stop("the baseline cannot be measured: nothing to compare candidates with")
            return Decision(params=self.space.baseline_params(), source=DecisionSource.BASELINE.value,
                            reason="trial 0: the starting point every speed-up is relative to",
                            profile=True)
        built = self._built_code(ctx)
        self._fit()
        f_best, ranked_keys, lead = self._incumbent_level()
        search_key = ranked_keys[0]
        self._challenge(search_key)
        inc_code = np.array(search_key)
        inc = self._latest[search_key]
        cands = self.proposer.candidates(self._trials, inc_code, inc.measurement.buckets_ms or {}, built,
                                         [np.array(k) for k in ranked_keys[1:4]], self.buckets, self._evaluated)
        ranked = self.chooser.rank(cands, inc_code, f_best, built, self._transition_of(ctx), self._evaluated,
                                   ctx.costs, inc.measurement.buckets_ms or {})
        if self.pending is not None and lead >= MATERIAL_LEAD:
            repeat = self._repeat_decision(ctx, built, "")
            if repeat is not None and not self._explore_first(repeat, lead, ranked, ctx):
                return repeat
        pick, why = self.stop_rule.check(ranked, ctx.budget_left_s, ctx.reserve_s, n_measured=len(self._evaluated),
                                         needed=ctx.costs.needed_s)
        if pick is None and not why.startswith("budget"):
            pick, why = self._before_stopping(ctx, inc_code, f_best, built, ranked, why)
        if pick is None:
            if self.pending is not None:  # settle the challenger before handing over the best
                repeat = self._repeat_decision(ctx, built, "before stopping: ")
                if repeat is not None:
                    return repeat
            return Stop(why)
        return self._decision(pick, inc, ctx, note=why)

    def observe(self, outcome: TrialOutcome, ctx: SearchContext) -> None:
        if outcome.result.diagnosis is not None:  # the loop's one diagnosis of it, as stored
            self.diagnoses[outcome.number] = outcome.result.diagnosis
        self._sync(ctx.history)

    def diagnose(self, outcome: TrialOutcome, history: list[TrialOutcome]) -> Diagnosis:
        """Predicted vs measured gain and the bucket diff against the trial's parent (pure: the loop
        calls it before recording the trial, to store it with the result)."""
        parent_no = outcome.decision.parent if outcome.decision is not None else None
        parent = next((t for t in history if t.number == parent_no), None) if parent_no is not None else None
        return diagnose_trial(outcome, parent).as_diagnosis()

    def _before_stopping(self, ctx: SearchContext, inc_code: np.ndarray, f_best: float, built: Any,
                         ranked: list[Any], why: str) -> tuple[Any | None, str]:
        """The stop rule says nothing is worth it: stop only on a calibrated model that leaves
        nothing cheap and plausible untried (an untried one-knob move of the incumbent)."""
        cheap_s = COVER_MAX_FRACTION * ctx.budget_left_s

        def plausible(c: Any) -> bool:  # cheap, more likely to run than fail, and worth it at 2 sd
            optimistic = math.expm1(c.mu + 2.0 * c.gain_sd - f_best) * (1.0 - c.p_fail)
            return c.cost.total_s <= cheap_s and ctx.fits(c.cost.total_s) and c.p_fail < COVER_MAX_FAIL and \
                optimistic >= self.stop_rule.min_gain.rate * max(c.cost.total_s, 1.0)

        margin = self._worth_with_margin(ranked, f_best, ctx)
        if margin is not None:
            return margin, (f"not stopping: with every sd x{STOP_SD_MARGIN:g} (what calibration on the tried "
                            f"configurations cannot vouch for) this one is still worth its cost")
        if not self.calibration.calibrated():
            cheap = [c for c in ranked if plausible(c)]
            if cheap:
                pick = max(cheap, key=lambda c: c.mu + 2.0 * c.gain_sd)
                return pick, f"not stopping on an uncalibrated model ({self.calibration.text()}): the most optimistic cheap candidate"
            return None, f"{self.calibration.text()}, not enough to trust it, but nothing cheap is left to explore; {why}"
        moves = [Candidate(c, "neighbour", "one knob from the incumbent, untried before stopping")
                 for c in self.proposer._one_knob(inc_code)
                 if tuple(int(x) for x in c) not in self._evaluated and self.view.feasible(c)]
        if moves:
            scored = self.chooser.rank(moves, inc_code, f_best, built, self._transition_of(ctx), self._evaluated,
                                       ctx.costs)
            cheap = [c for c in scored if plausible(c)]
            if cheap:
                pick = max(cheap, key=lambda c: c.mu + 2.0 * c.gain_sd)
                return pick, f"before stopping: {len(cheap)} cheap one-knob moves of the incumbent untried"
        return None, f"{self.calibration.text()}; {why}"

    def _worth_with_margin(self, ranked: list[Any], f_best: float, ctx: SearchContext) -> Any | None:
        """The candidate with the best rate if every sd were STOP_SD_MARGIN times wider, when that rate
        clears the stop rule's; else None."""
        fits = [c for c in ranked if ctx.fits(c.cost.total_s)]
        if not fits:
            return None
        mu = np.array([c.mu for c in fits])
        sd = STOP_SD_MARGIN * np.array([max(c.gain_sd, 1e-9) for c in fits])
        worth = np.expm1(expected_improvement(mu, sd, f_best))
        pf = np.array([c.p_fail for c in fits])
        fresh = ctx.costs.fresh_start_s()
        rate = worth * (1 - pf) / np.maximum([c.cost.total_s + p * fresh for c, p in zip(fits, pf)], 1.0)
        best = int(np.argmax(rate))
        return fits[best] if rate[best] >= self.stop_rule.min_gain.rate else None

    # ---- what the agent believes -----------------------------------------------------------------
    def best_params(self) -> dict[str, Any] | None:
        """The incumbent: the best configuration whose win was outside the noise."""
        return self.view.decode(np.array(self.best_key)) if self.best_key is not None else None

    @property
    def last_diagnosis(self) -> str | None:
        return self.diagnoses[max(self.diagnoses)].verdict if self.diagnoses else None

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
        if key not in self._evaluated:
            self.failures.add(code, failed=not ok)
            notes = t.decision.notes if t.decision is not None else None
            if notes and notes.get("p_fail") is not None:  # its own odds, before the cap they earn
                self.failures.score(float(notes.get("p_fail_raw", notes["p_fail"])), failed=not ok)
        self._evaluated.add(key)
        if not ok:
            self._trials.append((code, None))
            self._built = None
            return
        if self._ref_log is None:
            self._ref_log = math.log(t.objective)
        self.noise.add(key, t.objective, t.objective_ci)
        y = math.log(t.objective) - self._ref_log
        self._score(t, y)
        self._row_of[key] = len(self._rows)
        self._rows.append((code, y, measurement_sd(t.objective, t.objective_ci)))
        self._trials.append((code, y))
        self._latest[key] = t
        self.buckets.add(code, t.measurement.buckets_ms or {}, is_baseline=self.best_key is None,
                         coverage=t.measurement.bucket_coverage, kernels_by_bucket=t.measurement.kernels_by_bucket)
        self._built = code
        if self.best_key is None:
            self.best_key = key
        elif key != self.best_key:
            self._settled.discard(key)  # new evidence: it may challenge again
            if self.noise.compare(key, self.best_key)[0] == "win":
                self._crown(key, "measured outside the noise")

    def _score(self, t: TrialOutcome, y: float) -> None:
        """The trial's measured gain against the interval predicted when it was chosen."""
        notes = t.decision.notes if t.decision is not None else None
        if notes and notes.get("pred_log") is not None and notes.get("pred_sd") is not None:
            self.calibration.add(float(notes["pred_log"]), float(notes["pred_sd"]), y,
                                 float(notes.get("sd_scale") or 1.0))

    def _challenge(self, key: Key) -> None:
        """The model's best measured configuration challenges the declared best. It wins on its
        repeats (autoopt.search.agent.noise), or on the model's pooled evidence: its own repeats put it
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
        self.model.sd_scale = self.calibration.scale()
        if self.prior is not None:  # the other study's rows first: the run's own rows extend them
            if self.prior.update({k: self._rows[i][1] for k, i in self._row_of.items()}) and not self.prior.useful:
                self.notes.append(self.prior.text())
                # the misses scored so far were the warm start's: the model without it is judged anew
                self.calibration = Calibration()
            Xp, yp, sdp = self.prior.rows()
            X, y, sd = np.concatenate([Xp, X]), np.concatenate([yp, y]), np.concatenate([sdp, sd])
        self.model.fit(X, y, sd)

    def _incumbent_level(self) -> tuple[float, list[Key], float]:
        """The best GP posterior mean among measured configurations, those configurations by it,
        and the model's lead of the best over the declared best (log units)."""
        keys = list(self._latest)
        skip = len(self.prior.rows()[0]) if self.prior is not None else 0
        mu = self.model.train_mean()[[skip + self._row_of[k] for k in keys]]
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
        batch = f"; opens a build with {pick.batch} cheap runtime variants to try next" if pick.batch else ""
        cand_note = f"{pick.cand.note}; " if pick.cand.note else ""
        reason = (f"{pick.label}: {cand_note}expected {fmt_gain(pick.gain, pick.gain_sd)} "
                  f"(worth {fmt_gain(pick.worth)}) for {pick.cost.text()}{batch}")
        if note:
            reason += f"; {note}"
        if pick.p_fail > 0.1:
            reason += f"; {100 * pick.p_fail:.0f}% odds it fails like similar configurations"
        profile = any(not self.buckets.known(p, int(v)) for p, v in enumerate(pick.code)
                      if v != self.view.base_code[p])
        return Decision(params=self.view.decode(pick.code), source=pick.cand.source, reason=reason,
                        expected_gain=pick.gain, expected_gain_sd=pick.gain_sd, expected_cost=pick.cost,
                        parent=inc.number, profile=profile,
                        notes={"worth": pick.worth, "p_fail": pick.p_fail, "rate_per_10min": pick.rate * 600,
                               "p_fail_raw": float(self.failures.raw_probs(pick.code[None, :])[0]),
                               "batch": pick.batch, "pred_log": pick.mu, "pred_sd": pick.gain_sd,
                               "ref_log": self._ref_log, "sd_scale": self.model.sd_scale})

    def _explore_first(self, repeat: Decision, lead: float, ranked: list[Any], ctx: SearchContext) -> bool:
        """Settling a lead inside the noise is worth at most the lead (keeping the wrong one of two
        near-equal configurations): a candidate worth more per second goes first; the repeat waits."""
        best = next((c for c in ranked if ctx.fits(c.cost.total_s)), None)
        if best is None or repeat.expected_cost is None:
            return False
        settle_rate = lead / max(repeat.expected_cost.total_s, 1.0)
        if best.rate <= settle_rate:
            return False
        self.notes.append(f"settling a {fmt_gain(lead)} lead can wait: {best.label} is worth more per second")
        return True

    def _repeat_decision(self, ctx: SearchContext, built: np.ndarray | None, why: str) -> Decision | None:
        """Re-measure challenger or incumbent while the challenger's lead is inside the noise."""
        if self.pending is None:
            return None
        ch, inc = self.pending, self.best_key
        tr_of = self._transition_of(ctx)
        built_params = self.view.decode(built) if built is not None else None
        costs = {k: ctx.costs.estimate(built_params, self.view.decode(np.array(k)), tr_of(np.array(k)))
                 for k in (ch, inc)}
        key = self.noise.next_to_measure(ch, inc, {k: c.total_s for k, c in costs.items()})
        cost = costs[key]
        if not ctx.fits(cost.total_s):
            self.notes.append("no budget left to settle a challenger inside the noise: incumbent kept")
            self.pending = None
            return None
        _, gain, sd = self.noise.compare(ch, inc)
        who = "challenger" if key == ch else "incumbent"
        reason = (f"{why}re-measure the {who} (challenger: {self.view.describe(np.array(ch), np.array(inc))}): "
                  f"it leads by "
                  f"{fmt_gain(gain, 1.96 * sd)}, inside the noise; a win must clear the noise "
                  f"(n={self.noise.n(ch)} vs {self.noise.n(inc)}; {cost.text()})")
        return Decision(params=self.view.decode(np.array(key)), source=DecisionSource.REPEAT.value,
                        reason=reason, expected_cost=cost, parent=self._latest[inc].number,
                        notes={"repeat_of": who})

