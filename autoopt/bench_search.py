"""`autoopt bench-search`: every strategy on every replay table, many seeds, on the simulated clock.

Each run is the real search loop (autoopt.loop.SearchLoop: baseline first, budget with a reserve,
the strategy's own stop, the final confirmation) against a ReplayTarget, with the trial records kept
in memory instead of SQLite (`MemoryStore`: what the loop asks of a store, nothing more), so 20 seeds
x 4 strategies x a few tables run in seconds.

Figures per table and strategy:
  reach_s   simulated seconds until the strategy's best configuration is, in truth (the table's
            recorded figure, not a noisy measurement), within 1% of the table's optimum. A strategy's
            best is what it would hand over: `best_params()` when it has one (the agent: its
            incumbent, which must have cleared the noise), else the best measured trial. Runs that
            never reach it count as ∞ ("never") in the median and IQR, honestly.
  best      the true figure of that best at the end of the run, as a fraction of the optimum.
  stopped   runs the strategy itself ended before the budget ran out (its stop rule).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autoopt.targets.replay import ReplayTarget, replay_space
from autoopt.targets.replay_table import ReplayTable, load_table

DEFAULT_STRATEGIES = ("agent", "tpe", "random", "grid")
WITHIN = 0.01


@dataclass
class _Handle:
    number: int
    trial_id: int
    study_name: str
    run_id: int | None


class MemoryStore:
    """The part of autoopt.store.Store the loop uses, in memory (no database, no Optuna storage)."""

    def __init__(self) -> None:
        self.finished: list[tuple[Any, Any, float | None, dict[str, Any]]] = []
        self.stop_reason: str | None = None
        self._n = 0

    def mark_interrupted(self, study_name: str) -> list[Any]:
        return []

    def trials(self, study_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    def begin_trial(self, run_id: Any, study_name: str, params: dict[str, Any], config: dict[str, Any],
                    decision: Any, **kwargs: Any) -> _Handle:
        h = _Handle(self._n, self._n, study_name, run_id)
        self._n += 1
        return h

    def finish_trial(self, handle: _Handle, measurement: Any, objective: float | None,
                     extra: dict[str, Any] | None = None) -> None:
        self.finished.append((handle, measurement, objective, dict(extra or {})))

    def finish_run(self, run_id: Any, state: str, stop_reason: str) -> None:
        self.stop_reason = stop_reason


class _ReachObserver:
    """Watches every finished trial for the moment the strategy's best is within 1% of the optimum."""

    def __init__(self, table: ReplayTable, target: ReplayTarget, strategy: Any, space: Any) -> None:
        self.table, self.target, self.strategy, self.space = table, target, strategy, space
        self.optimum = table.score(table.optimum().value)
        self.reach_s: float | None = None
        self.best_frac = 0.0
        self.trials = 0
        self._best: Any = None
        self.last_search_end = 0.0

    def true_frac(self, params: dict[str, Any] | None) -> float:
        if params is None:
            return 0.0
        config = self.space.params_to_config(params)
        config.pop("layer_overrides", None)
        row = self.table.rows.get(self.table.key(config))
        return 0.0 if row is None or row.value is None else self.table.score(row.value) / self.optimum

    def trial_finished(self, outcome: Any, best: Any, baseline: Any, budget: Any) -> None:
        self.trials += 1
        if outcome.decision is not None and outcome.decision.source == "confirm":
            return
        self._best = best
        self._update(self.target.now())

    def _update(self, now: float) -> None:
        best = self._best
        chosen = self.strategy.best_params() if hasattr(self.strategy, "best_params") else \
            (best.params if best is not None else None)
        self.best_frac = self.true_frac(chosen)
        if self.reach_s is None and self.best_frac >= 1.0 - WITHIN:
            self.reach_s = now
        self.last_search_end = now

    def stopped(self) -> None:
        """The strategy may settle its best when it decides to stop (after the last search trial)."""
        self._update(self.last_search_end)

    def run_started(self, *args: Any) -> None: ...
    def trial_started(self, *args: Any) -> None: ...
    def phase(self, *args: Any) -> None: ...
    def note(self, *args: Any) -> None: ...
    def run_finished(self, *args: Any) -> None: ...
    def close(self) -> None: ...


@dataclass
class RunStats:
    table: str
    strategy: str
    seed: int
    reach_s: float  # inf: never
    best_frac: float
    trials: int
    elapsed_s: float  # simulated
    stopped_early: bool
    stop_reason: str
    wall_s: float


class _IncrementalStudy:
    """Speeds up autoopt.strategies.sampler.SamplerStrategy for benchmarking without changing what
    it proposes: instead of rebuilding its in-memory study from the whole history at every proposal
    (O(n) Optuna trial copies each time), keep one study, add only the new history entries, and give
    it the fresh, identically seeded sampler the strategy would have used. Optuna's samplers ignore
    the FAIL trials the strategy's rejected candidates leave behind, so the proposals are the same
    (tests/test_bench_search.py checks this against the original)."""

    def __init__(self, strat: Any) -> None:
        self.strat, self.study, self.n = strat, None, 0
        self.original = strat._study

    def __call__(self, history: list[Any]) -> Any:
        import optuna

        sampler = self.strat._make_sampler()
        junk = len(self.study.get_trials(deepcopy=False)) - self.n if self.study is not None else 0
        if self.study is None or len(history) < self.n or junk > max(16, self.n):
            self.study, self.n = self.original([]), 0  # start over: rejected asks pile up as FAIL
        dists = self.strat.space.distributions()
        for t in history[self.n:]:
            if not self.strat._fits(t.params):
                continue
            if t.objective is not None:
                frozen = optuna.trial.create_trial(params=t.params, distributions=dists, value=t.objective)
            else:
                frozen = optuna.trial.create_trial(params=t.params, distributions=dists,
                                                   state=optuna.trial.TrialState.FAIL)
            self.study.add_trial(frozen)
        self.n = len(history)
        self.study.sampler = sampler
        return self.study


def speed_up(strat: Any) -> Any:
    """Install `_IncrementalStudy` on an Optuna-sampler strategy (others are returned unchanged)."""
    if callable(getattr(strat, "_study", None)) and hasattr(strat, "_make_sampler") and hasattr(strat, "_fits"):
        strat._study = _IncrementalStudy(strat)
    return strat


def run_one(table: ReplayTable, strategy: str, seed: int, budget_s: float,
            options: dict[str, Any] | None = None, fast: bool = True) -> RunStats:
    from autoopt import strategies
    from autoopt.budget import Budget
    from autoopt.loop import LoopSettings, SearchLoop

    t0 = time.perf_counter()
    target = ReplayTarget(table, seed=seed)
    space = replay_space(target)
    strat = strategies.get(strategy, space, seed, **(options or {}).get(strategy, {}))
    if fast:
        strat = speed_up(strat)
    budget = Budget(total_s=budget_s, clock=target.now)
    obs = _ReachObserver(table, target, strat, space)
    loop = SearchLoop(MemoryStore(), target, space, strat, budget,
                      LoopSettings(study_name=f"bench-{strategy}-{seed}", handle_sigint=False),
                      observer=obs)
    result = loop.run()
    obs.stopped()
    stopped = result.stop_reason.startswith("strategy stopped") and "exhausted" not in result.stop_reason
    return RunStats(table=table.path.name, strategy=strategy, seed=seed,
                    reach_s=obs.reach_s if obs.reach_s is not None else math.inf,
                    best_frac=obs.best_frac, trials=obs.trials, elapsed_s=target.now(),
                    stopped_early=stopped and target.now() < budget_s, stop_reason=result.stop_reason,
                    wall_s=time.perf_counter() - t0)


def default_budget_s(table: ReplayTable) -> float:
    """A tenth of what measuring every row once would take (restarts not counted), and at least
    what 40 typical trials take (a restart of the median knob, compile, measurement): long enough
    for every strategy to get near, short enough that exhausting a large table is not an option."""
    target = ReplayTarget(table)
    per_row = [(r.measure_s if r.measure_s is not None else target.measure_s) + r.compile_s
               for r in table.rows.values()]
    typical = statistics.median(per_row) + statistics.median(target.restart_s.values() or [0.0])
    return max(0.10 * sum(per_row), 40.0 * typical)


def _job(args: tuple) -> RunStats:
    path, strategy, seed, budget_s, options = args
    return run_one(_table(path), strategy, seed, budget_s, options)


_TABLES: dict[str, ReplayTable] = {}


def _table(path: str) -> ReplayTable:
    if path not in _TABLES:
        _TABLES[path] = load_table(path)
    return _TABLES[path]


def bench(tables: list[str | Path], strategies: tuple[str, ...] = DEFAULT_STRATEGIES, seeds: int = 20,
          budget_s: float | None = None, workers: int = 1,
          options: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    jobs, budgets = [], {}
    for path in tables:
        table = _table(str(path))
        budgets[table.path.name] = budget_s if budget_s is not None else default_budget_s(table)
        for strategy in strategies:
            for seed in range(seeds):
                jobs.append((str(path), strategy, seed, budgets[table.path.name], options or {}))
    if workers > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(workers) as pool:
            runs = pool.map(_job, jobs, chunksize=1)
    else:
        runs = [_job(j) for j in jobs]
    return {"runs": [asdict(r) for r in runs], "summary": summarize(runs, budgets),
            "budgets_s": budgets, "seeds": seeds, "strategies": list(strategies),
            "tables": {_table(str(p)).path.name: _table_info(_table(str(p))) for p in tables},
            "wall_s": time.perf_counter() - t0}


def _table_info(t: ReplayTable) -> dict[str, Any]:
    best = t.optimum()
    return {"path": str(t.path), "sha256": t.sha256, "rows": len(t.rows), "valid": len(t.valid_rows()),
            "objective": t.objective, "direction": "minimize" if t.minimize else "maximize",
            "optimum": best.value, "optimum_config": best.config,
            "within_1pct": sum(1 for r in t.valid_rows() if t.score(r.value) >= (1 - WITHIN) * t.score(best.value))}


def _quantiles(xs: list[float]) -> tuple[float, float, float]:
    xs = sorted(xs)
    if not xs:
        return math.nan, math.nan, math.nan

    def q(p: float) -> float:  # linear interpolation; next to a "never", the nearest rank
        pos = p * (len(xs) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        if lo == hi or xs[hi] == xs[lo]:
            return xs[lo]
        if math.isinf(xs[hi]):
            return xs[lo] if pos - lo < 0.5 else math.inf  # a tie goes to "never"
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    return q(0.25), q(0.5), q(0.75)


def summarize(runs: list[RunStats], budgets: dict[str, float]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in runs:
        out.setdefault(r.table, {}).setdefault(r.strategy, []).append(r)
    summary: dict[str, dict[str, Any]] = {}
    for table, by_strategy in out.items():
        summary[table] = {}
        for strategy, rs in by_strategy.items():
            q1, med, q3 = _quantiles([r.reach_s for r in rs])
            b1, bmed, b3 = _quantiles([r.best_frac for r in rs])
            summary[table][strategy] = {
                "runs": len(rs), "reached": sum(1 for r in rs if math.isfinite(r.reach_s)),
                "reach_s_median": med, "reach_s_q1": q1, "reach_s_q3": q3,
                "best_frac_median": bmed, "best_frac_q1": b1, "best_frac_q3": b3,
                "stopped_early": sum(1 for r in rs if r.stopped_early),
                "elapsed_s_median": statistics.median(r.elapsed_s for r in rs),
                "trials_median": statistics.median(r.trials for r in rs),
                "wall_s_mean": statistics.fmean(r.wall_s for r in rs), "budget_s": budgets[table]}
    return summary


def _t(s: float) -> str:
    if not math.isfinite(s):
        return "never"
    if s < 90:
        return f"{s:.0f}s"
    return f"{s / 60:.0f}m" if s < 5400 else f"{s / 3600:.1f}h"


def render(result: dict[str, Any]) -> str:
    lines = []
    for table, by_strategy in result["summary"].items():
        info = result["tables"][table]
        lines.append(f"{table}: {info['valid']} valid rows, optimum {info['objective']}={info['optimum']:g} "
                     f"({info['within_1pct']} rows within 1%), budget {_t(result['budgets_s'][table])} simulated")
        lines.append(f"  {'strategy':<8} {'reach 1% (median [IQR])':<26} {'reached':>8} "
                     f"{'best at end':>12} {'stopped':>8} {'trials':>7} {'wall/run':>9}")
        for strategy, s in by_strategy.items():
            reach = f"{_t(s['reach_s_median'])} [{_t(s['reach_s_q1'])}, {_t(s['reach_s_q3'])}]"
            lines.append(f"  {strategy:<8} {reach:<26} {s['reached']:>4}/{s['runs']:<3} "
                         f"{100 * s['best_frac_median']:>11.1f}% {s['stopped_early']:>8} "
                         f"{s['trials_median']:>7.0f} {s['wall_s_mean']:>8.2f}s")
    lines.append(f"({result['seeds']} seeds; wall {result['wall_s']:.1f}s; reach = simulated time until the "
                 "strategy's best is truly within 1% of the table's optimum; never = not within the budget)")
    return "\n".join(lines)


def to_json(x: Any) -> Any:
    """The result as JSON-ready data: inf -> "inf" (JSON has no infinity)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): to_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_json(v) for v in x]
    return x
