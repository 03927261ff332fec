"""TPE / random / GP strategies: an Optuna sampler proposes, on an in-memory copy of the history.

Every proposal builds a fresh in-memory study from the trials evaluated so far (the real study only
ever receives evaluated trials: asking it for throw-away candidates would litter it with junk), asks
the sampler for a point, and rejects points that break a space constraint or that were already
measured. After `max_attempts` rejections it falls back to a uniformly random unmeasured feasible
point; when none is left the space is exhausted and the strategy asks to stop.

`incremental=True` (bench-search, many runs of many trials) keeps one in-memory study instead and
adds only the new history entries, giving it the fresh, identically seeded sampler the rebuild would
have had. Optuna's samplers ignore the FAIL trials rejected candidates leave behind, so it proposes
exactly what the rebuild does (tests/test_bench_search.py checks this), in O(new trials) per proposal.
"""
from __future__ import annotations

import logging
import random
import warnings
from typing import Any

from autoopt.search.strategy import Decision, SearchContext, Stop, TrialOutcome
from autoopt.trial import DecisionSource

SAMPLERS = ("tpe", "random", "gp")


class SamplerStrategy:
    """An Optuna sampler as a Strategy. Options: n_startup_trials (TPE/GP), max_attempts, incremental."""

    def __init__(self, space: Any, sampler: str = "tpe", seed: int | None = None,
                 n_startup_trials: int | None = None, max_attempts: int = 64,
                 exhaustive_limit: int = 20000, incremental: bool = False) -> None:
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        self.space = space
        self.sampler_name = sampler
        self.name = sampler
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2 ** 31)
        # few trials per run: leave the random start early (but explore each parameter a little)
        self.n_startup_trials = n_startup_trials if n_startup_trials is not None else \
            max(4, min(10, len(space.params) // 2 + 2))
        self.max_attempts = max_attempts
        self.exhaustive_limit = exhaustive_limit  # spaces up to this size are enumerated when needed
        self.proposals = 0
        self.incremental = incremental
        self._kept: Any = None  # the kept study (incremental) and how many history entries it holds
        self._kept_n = 0
        self._kept_space: Any = None  # the kept study's IntersectionSearchSpace (Optuna's cache)
        self._seen: set[str] = set()  # config keys of the history's first `_seen_n` entries
        self._seen_n = 0

    # ---- Strategy protocol ---------------------------------------------------------------------
    def propose(self, ctx: SearchContext) -> Decision | Stop:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        logging.getLogger("optuna").setLevel(logging.WARNING)
        self.proposals += 1
        seen = self._seen_keys(ctx.history)
        study = self.study(ctx.history)
        dists = self.space.distributions()
        rejected_constraint = rejected_seen = 0
        for _ in range(self.max_attempts):
            trial = study.ask(dists)
            params = dict(trial.params)
            if not self.space.is_feasible(params):
                rejected_constraint += 1
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            if self.space.config_key(params) in seen:
                rejected_seen += 1
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            n_obs = sum(1 for t in ctx.history if t.objective is not None)
            phase = "startup (random)" if self.sampler_name != "random" and n_obs < self.n_startup_trials \
                else "model"
            reason = (f"{self.sampler_name.upper()} {phase}: {self._changes(params)}"
                      f" [{n_obs} measured; rejected {rejected_constraint} by constraints,"
                      f" {rejected_seen} already measured]")
            return Decision(params=params, source=f"{DecisionSource.SAMPLER.value}:{self.sampler_name}",
                            reason=reason, notes={"sampler": self.sampler_name, "seed": self.seed})
        params = self._random_unseen(seen)
        if params is None:
            if self.space.size() > self.exhaustive_limit:
                return Stop(f"no unmeasured configuration satisfying the constraints found in "
                            f"{max(200, 4 * self.max_attempts)} random draws ({len(seen)} measured)")
            return Stop(f"space exhausted: every feasible configuration of {self.space.name} "
                        f"({len(seen)}) has been measured")
        return Decision(params=params, source=f"{DecisionSource.SAMPLER.value}:random-fallback",
                        reason=f"{self.sampler_name.upper()} kept re-proposing measured or infeasible "
                               f"points; random unmeasured point: {self._changes(params)}",
                        notes={"sampler": self.sampler_name, "seed": self.seed})

    def observe(self, outcome: TrialOutcome, ctx: SearchContext) -> None:
        """Nothing to keep: the next proposal rebuilds its in-memory study from the history."""

    # ---- helpers -------------------------------------------------------------------------------
    def _seen_keys(self, history: list[TrialOutcome]) -> set[str]:
        """Config keys of every measured configuration, brought up to date with the new entries only
        (a history only grows within a run; a shorter one starts over)."""
        if len(history) < self._seen_n:
            self._seen, self._seen_n = set(), 0
        self._seen |= {self.space.config_key(t.params) for t in history[self._seen_n:] if self._fits(t.params)}
        self._seen_n = len(history)
        return set(self._seen)

    def _fits(self, params: dict[str, Any]) -> bool:
        return set(params) == set(self.space.param_by_name) and all(
            params[n] in self.space.param_by_name[n].choices for n in params)

    def _make_sampler(self) -> Any:
        import optuna

        seed = self.seed + 7919 * self.proposals  # deterministic per run, different per proposal
        if self.sampler_name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if self.sampler_name == "gp":
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=self.n_startup_trials)
        return tpe_sampler(seed=seed, n_startup_trials=self.n_startup_trials, multivariate=True,
                           constant_liar=False)

    def study(self, history: list[TrialOutcome]) -> Any:
        """An in-memory study holding the history (measured: COMPLETE, failed/wrong: FAIL) with this
        proposal's sampler: rebuilt each time, or (incremental) the kept one brought up to date."""
        import optuna

        sampler = self._make_sampler()
        if not self.incremental:
            study = optuna.create_study(direction="maximize", sampler=sampler)
            self._add(study, history)
            return study
        junk = len(self._kept.get_trials(deepcopy=False)) - self._kept_n if self._kept is not None else 0
        if self._kept is None or len(history) < self._kept_n or junk > max(16, self._kept_n):
            # start over: rejected asks pile up as FAIL trials
            self._kept, self._kept_n = optuna.create_study(direction="maximize", sampler=sampler), 0
            self._kept_space = getattr(sampler, "_search_space", None)
        self._add(self._kept, history[self._kept_n:])
        self._kept_n = len(history)
        if self._kept_space is not None and hasattr(sampler, "_search_space"):
            # the study's intersection search space, computed incrementally (Optuna caches it per
            # trial number in this object): the same space a fresh one computes over every trial
            sampler._search_space = self._kept_space
        self._kept.sampler = sampler
        return self._kept

    def _add(self, study: Any, trials: list[TrialOutcome]) -> None:
        import optuna

        dists = self.space.distributions()
        for t in trials:
            if not self._fits(t.params):  # recorded under an older version of the space file
                continue
            if t.objective is not None:
                frozen = optuna.trial.create_trial(params=t.params, distributions=dists, value=t.objective)
            else:
                frozen = optuna.trial.create_trial(params=t.params, distributions=dists,
                                                   state=optuna.trial.TrialState.FAIL)
            study.add_trial(frozen)

    def _random_unseen(self, seen: set[str]) -> dict[str, Any] | None:
        rng = random.Random(self.seed * 31 + self.proposals)
        for _ in range(max(200, 4 * self.max_attempts)):
            params = {p.name: rng.choice(p.choices) for p in self.space.params}
            if self.space.is_feasible(params) and self.space.config_key(params) not in seen:
                return params
        if self.space.size() > self.exhaustive_limit:
            return None
        import itertools

        names = [p.name for p in self.space.params]
        for combo in itertools.product(*(p.choices for p in self.space.params)):
            params = dict(zip(names, combo))
            if self.space.is_feasible(params) and self.space.config_key(params) not in seen:
                return params
        return None

    def _changes(self, params: dict[str, Any]) -> str:
        base = self.space.baseline_params()
        diff = [f"{k}={v}" for k, v in params.items() if base.get(k) != v]
        return ", ".join(diff) if diff else "the baseline configuration"


def _tpe_class() -> Any:
    import optuna

    class ReusingTPE(optuna.samplers.TPESampler):
        """TPE that builds each Parzen estimator once per set of trials. A proposal whose draw is
        rejected (infeasible, or measured already) asks again: over the same finished trials, the
        estimators are the same, and only the random draw from them differs. Rebuilding them was most
        of bench-search's TPE time on the landscapes (15 asks a proposal). The draws, and so the
        proposals, are unchanged (tests/test_bench_search.py)."""

        def _build_parzen_estimator(self, study: Any, search_space: Any, trials: list, handle_below: bool) -> Any:
            key = (handle_below, tuple(search_space), tuple(t.number for t in trials))
            cache = self.__dict__.setdefault("_autoopt_parzen", {})
            if key not in cache:
                cache.clear() if len(cache) > 8 else None
                cache[key] = super()._build_parzen_estimator(study, search_space, trials, handle_below)
            return cache[key]

    return ReusingTPE


def tpe_sampler(**kwargs: Any) -> Any:
    """Optuna's TPESampler(**kwargs), its Parzen estimators built once per set of trials (the class is
    made on first use: optuna is imported only by the strategies that sample)."""
    global _REUSING_TPE
    if _REUSING_TPE is None:
        _REUSING_TPE = _tpe_class()
    with warnings.catch_warnings():
        # `multivariate` is Optuna's "experimental" flag: its ExperimentalWarning interleaved with
        # the run's trial lines on the live H100 log and tells the user nothing they can act on
        warnings.filterwarnings("ignore", message=r".*``multivariate`` is an experimental feature")
        return _REUSING_TPE(**kwargs)


_REUSING_TPE: Any = None
