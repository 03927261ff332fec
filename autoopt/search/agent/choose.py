"""Which candidate next: expected gain, with its uncertainty, per second of transition + measurement.

For every candidate the GP gives mean ± sd of log(objective); against the incumbent (the best
posterior mean among measured configurations) that is a mean gain ± sd and an expected improvement
(`worth`: the mean gain counted only where it is a win, weighted by its odds). The odds that the
configuration fails at all (learned from failed trials sharing its non-baseline values, singly and in
pairs; autoopt.search.agent.failure) discount it, and a failure leaves no worker running, so its odds also
buy the next trial a fresh start. The rate is
    worth x (1 - p_fail) / (transition + measurement + p_fail x fresh start seconds).

Builds are batched: a candidate that needs a rebuild or restart opens a build in which its runtime-
only variants cost just a measurement; its rate is the best of trying it alone or it plus its k best
runtime siblings (each later one discounted by half, since their wins overlap) for one transition
and k+1 measurements. The greedy choice from what is built now then tries a build's cheap variants
before paying the next restart, and never goes back to a build without a reason worth the restart.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autoopt.search.agent.failure import FailureModel
from autoopt.search.agent.linalg import one_blas_thread
from autoopt.search.agent.model import GainModel, expected_improvement
from autoopt.search.agent.propose import Candidate
from autoopt.search.agent.view import SpaceView
from autoopt.search.cost import CostModel
from autoopt.trial import CostEstimate

PROFILE_MIN_GAIN = 0.01
BATCH_MAX = 3
BATCH_DISCOUNT = 0.5
COST_KEEP = 48  # candidates costed (the target's facts are asked per candidate): the largest
                # expected improvements net of the failure odds, plus ...
CHEAP_KEEP = 16  # ... the best of those that reuse the running build (cheap whatever their gain)
ALONE_MIN_RATIO = 3.0  # a transition this many measurements long is dear enough to go alone ...
RIDERS_MAX_SHARE = 0.25  # ... when the other switches of the move cost at most this share of it


@dataclass
class Scored:
    cand: Candidate
    label: str
    gain: float  # mean relative gain over the incumbent
    gain_sd: float
    worth: float  # expected improvement (relative)
    p_fail: float
    cost: CostEstimate
    rate: float  # worth x (1 - p_fail) per second
    batch: int = 0  # runtime siblings counted in the rate
    mu: float = 0.0  # log objective over the baseline (GP mean)

    @property
    def code(self) -> np.ndarray:
        return self.cand.code


class Chooser:
    def __init__(self, view: SpaceView, model: GainModel, failures: FailureModel) -> None:
        self.view, self.model, self.failures = view, model, failures

    @one_blas_thread  # the failure odds' fit and the GP's predictions: see linalg.one_blas_thread
    def rank(self, cands: list[Candidate], incumbent: np.ndarray, f_best: float, built: np.ndarray | None,
             transition_of: Any, skip: set[tuple[int, ...]], costs: CostModel,
             incumbent_ms: dict[str, float] | None = None) -> list[Scored]:
        """Score and sort (best rate first). `transition_of(code)` -> the target's Transition or None;
        `f_best`: the incumbent's log objective over the baseline (GP posterior mean); `costs`: the
        loop's cost model."""
        if not cands:
            return []
        X = np.stack([c.code for c in cands])
        mu, sd = self.model.predict(X)
        ei = expected_improvement(mu, sd, f_best)
        p_fail = self.failures.probs(X)
        keep = self._worth_costing(X, ei * (1.0 - p_fail), built)
        fresh_s = costs.fresh_start_s()
        built_params = self.view.decode(built) if built is not None else None

        def score(c: Candidate, m: float, s_d: float, e: float, pf: float) -> Scored:
            cost = costs.estimate(built_params, self.view.decode(c.code), transition_of(c.code))
            worth = float(np.expm1(e))
            rate = worth * (1.0 - pf) / max(expected_s(cost, pf, fresh_s), 1.0)
            return Scored(cand=c, label=self.view.describe(c.code, incumbent), gain=float(np.expm1(m - f_best)),
                          gain_sd=s_d, worth=worth, p_fail=pf, cost=cost, rate=rate, mu=m)

        scored = [score(cands[i], float(mu[i]), float(sd[i]), float(ei[i]), float(p_fail[i])) for i in keep]
        scored.sort(key=lambda s: -s.rate)
        self._batch(scored, built, f_best, skip, costs.measure_s())
        scored.sort(key=lambda s: -s.rate)
        self._credit_profile(scored[:20], incumbent, incumbent_ms or {})
        alone = self._alone(scored[0], incumbent, built_params, transition_of, skip, costs)
        if alone is not None:
            m, s_d = self.model.predict(alone.code[None, :])
            core = score(alone, float(m[0]), float(s_d[0]), float(expected_improvement(m, s_d, f_best)[0]),
                         float(self.failures.probs(alone.code[None, :])[0]))
            self._batch([core], built, f_best, skip, costs.measure_s())
            scored = [core] + [s for s in scored if not np.array_equal(s.code, alone.code)]
        return scored

    def _alone(self, top: Scored, incumbent: np.ndarray, built_params: Any, transition_of: Any,
               skip: set[tuple[int, ...]], costs: CostModel) -> Candidate | None:
        """An expensive switch travels alone. When the best candidate pairs one knob that carries
        nearly all of its transition (a whole-step compile) with riders that would cost little on
        their own, a loss would be blamed on the expensive knob, which is dear to try again, while
        the riders are cheap to try afterwards on its build. So the expensive knob goes first alone,
        unless the model expects it clearly worse without them (an interaction)."""
        changed = np.nonzero(top.code != incumbent)[0]
        if len(changed) < 2 or top.cost.transition_s < ALONE_MIN_RATIO * max(top.cost.measure_s, 1.0):
            return None
        for p in changed:
            core, riders = incumbent.copy(), top.code.copy()
            core[p], riders[p] = top.code[p], incumbent[p]
            if tuple(int(x) for x in core) in skip or not self.view.feasible(core):
                continue
            riders_s = costs.estimate(built_params, self.view.decode(riders), transition_of(riders)).transition_s
            if riders_s > RIDERS_MAX_SHARE * top.cost.transition_s:
                continue
            mu, _ = self.model.predict(core[None, :])
            if float(np.expm1(mu[0] - top.mu)) < -top.gain_sd:
                return None  # the riders matter to it: keep the pair
            return Candidate(core, top.cand.source,
                             f"{top.cand.note}; alone, without {self.view.describe(riders, incumbent)} (cheap to "
                             f"try on its build afterwards; a loss of the pair would be blamed on the dear switch)")
        return None

    def _worth_costing(self, X: np.ndarray, net_ei: np.ndarray, built: np.ndarray | None) -> np.ndarray:
        """Indices of the candidates to cost: the COST_KEEP largest expected improvements net of the
        failure odds, and the CHEAP_KEEP best of those that keep the running build."""
        order = np.argsort(-net_ei, kind="stable")
        keep = list(order[:COST_KEEP])
        if built is not None and (~self.view.runtime).any():
            fixed = ~self.view.runtime
            same_build = np.nonzero((X[:, fixed] == built[fixed][None, :]).all(axis=1))[0]
            same_build = same_build[np.argsort(-net_ei[same_build], kind="stable")][:CHEAP_KEEP]
            keep += [i for i in same_build if i not in set(keep)]
        return np.array(keep, dtype=np.int64)

    def _credit_profile(self, scored: list[Scored], incumbent: np.ndarray, inc_ms: dict[str, float]) -> None:
        """A candidate whose expected gain is mostly the profile model's (Amdahl on the incumbent's
        buckets) is profile-guided, whichever source proposed it: say so, and which bucket."""
        buckets = self.model.buckets
        if buckets is None or not buckets.ready or not inc_ms:
            return
        for s in scored:
            if s.cand.source.startswith("profile:"):
                continue
            gain, top = buckets.explain(incumbent, inc_ms, s.code)
            if top and gain > PROFILE_MIN_GAIN and gain >= 0.5 * s.gain:
                total = sum(inc_ms.values()) or 1.0
                s.cand = Candidate(s.cand.code, f"profile:{top}",
                                   f"{top} {100 * inc_ms.get(top, 0.0) / total:.0f}% of the step: Amdahl "
                                   f"{100 * gain:+.1f}% (proposed as {s.cand.source})")

    def _batch(self, scored: list[Scored], built: np.ndarray | None, f_best: float,
               skip: set[tuple[int, ...]], measure: float) -> None:
        """Raise the rate of build-opening candidates by what their runtime siblings are worth."""
        built_key = self.view.build_key(built) if built is not None else None
        if not self.view.runtime.any() or self.view.runtime.all():
            return  # no build to share (every switch is runtime, or none is)
        opening = [s for s in scored if self.view.build_key(s.code) != built_key][:10]
        if not opening:
            return
        for s in opening:
            sibs = [c for c in _runtime_siblings(self.view, s.code)
                    if tuple(int(x) for x in c) not in skip and self.view.feasible(c)]
            if not sibs:
                continue
            mu, sd = self.model.predict(np.stack(sibs))
            worth = np.sort(np.expm1(expected_improvement(mu, sd, f_best)))[::-1][:BATCH_MAX]
            total_worth, best_rate, best_k = s.worth * (1 - s.p_fail), s.rate, 0
            for k, w in enumerate(worth, start=1):
                total_worth += w * BATCH_DISCOUNT ** k
                rate = total_worth / max(s.cost.total_s + k * measure, 1.0)
                if rate > best_rate:
                    best_rate, best_k = rate, k
            s.rate, s.batch = best_rate, best_k


def expected_s(cost: CostEstimate, p_fail: float, fresh_s: float) -> float:
    """What trying a configuration costs on average: its transition, its measurement only if it
    runs (a crash, a compile error or a wrong answer ends the trial before any timing), and after a
    failure the fresh start the next trial pays (nothing is left running)."""
    return cost.transition_s + (1.0 - p_fail) * cost.measure_s + p_fail * fresh_s


def _runtime_siblings(view: SpaceView, code: np.ndarray) -> list[np.ndarray]:
    out = []
    for p in np.nonzero(view.runtime)[0]:
        for v in range(int(view.n_choices[p])):
            if v != code[p]:
                c = code.copy()
                c[p] = v
                out.append(c)
    return out
