"""`autoopt bench-search`: every strategy on every replay table, many seeds, on the simulated clock.

Each run is the real search loop (autoopt.search.loop.SearchLoop: baseline first, budget with a reserve,
the strategy's own stop, the final confirmation) against a ReplayTarget, with the trial records kept
in memory instead of SQLite (`search.memory_store.MemoryStore`: what the loop asks of a store), so 20 seeds
x 4 strategies x a few tables run in seconds.

Figures per table and strategy:
  reach_s   simulated seconds until the strategy's best configuration is, in truth (the table's
            recorded figure, not a noisy measurement), within 1% of the table's optimum. A strategy's
            best is what it would hand over: `best_params()` when it has one (the agent: its
            incumbent, which must have cleared the noise), else the best measured trial. Runs that
            never reach it count as ∞ ("never") in the median and IQR, honestly.
  best      the true figure of that best at the end of the run, as a fraction of the optimum.
  stopped   runs the strategy itself ended before the budget ran out (its stop rule: "nothing left is
            worth its cost"; a strategy saying the budget cannot fit its next trial, or that the space
            is exhausted, did not stop itself), and of those how many had their best within 1% of the
            optimum when they stopped.
  calib     the share of the strategy's trials whose measured gain fell inside the 95% interval it
            predicted for them (strategies that predict: the agent's `pred_log` / `pred_sd` notes,
            log objective over the baseline's); failed trials are not counted.
  cost      the share of the trials that ran (ok or wrong; not the baseline, common to every strategy)
            whose transition seconds the loop's one cost model predicted within 50% of the prediction
            (or half a second): the run summary's rule (autoopt.search.run_types.transition_within).
            Failed trials are not counted: a failure may end before its transition does.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autoopt.search.memory_store import MemoryStore
from autoopt.search.run_types import gain_inside, transition_seconds, transition_within
from autoopt.targets.replay.target import ReplayTarget, replay_space
from autoopt.targets.replay.table import ReplayTable, load_table
from autoopt.trial import DecisionSource
from autoopt.units import format_duration

DEFAULT_STRATEGIES = ("agent", "tpe", "random", "grid")
WITHIN = 0.01


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
        self.calib_inside = self.calib_n = 0
        self.cost_within = self.cost_n = 0
        self._base_log: float | None = None

    def true_frac(self, params: dict[str, Any] | None) -> float:
        if params is None:
            return 0.0
        config = self.space.params_to_config(params)
        config.pop("layer_overrides", None)
        row = self.table.rows.get(self.table.key(config))
        return 0.0 if row is None or row.value is None else self.table.score(row.value) / self.optimum

    def trial_finished(self, outcome: Any, best: Any, baseline: Any, budget: Any) -> None:
        self.trials += 1
        self._score_predictions(outcome, baseline)
        if outcome.decision is not None and outcome.decision.kind is DecisionSource.CONFIRM:
            return
        self._best = best
        self._update(self.target.now())

    def _score_predictions(self, outcome: Any, baseline: Any) -> None:
        """Calibration (the predicted 95% interval of the gain) and the cost model's transition error."""
        d = outcome.decision
        if d is None:
            return
        pair = transition_seconds(outcome) if d.kind is not DecisionSource.BASELINE else None
        if pair is not None:
            self.cost_n += 1
            self.cost_within += transition_within(*pair)
        if self._base_log is None and baseline is not None and baseline.objective:
            self._base_log = math.log(baseline.objective)
        inside = gain_inside(outcome, self._base_log)  # the run summary's count (run_types.gain_calibration)
        if inside is not None:
            self.calib_n += 1
            self.calib_inside += inside

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
    calib_inside: int = 0  # trials whose measured gain fell inside the predicted 95% interval
    calib_n: int = 0  # trials with a prediction and a measurement
    cost_within: int = 0  # trials whose transition seconds were predicted within 50%
    cost_n: int = 0


def run_one(table: ReplayTable, strategy: str, seed: int, budget_s: float,
            options: dict[str, Any] | None = None, fast: bool = True) -> RunStats:
    """One search on the simulated clock. fast: Optuna-sampler strategies keep their in-memory study
    between proposals (`incremental`, autoopt.search.sampler: the same proposals, less work)."""
    from autoopt.search import registry as strategies
    from autoopt.search.budget import Budget
    from autoopt.search.loop import LoopSettings, SearchLoop
    from autoopt.search.sampler import SAMPLERS

    t0 = time.perf_counter()
    target = ReplayTarget(table, seed=seed)
    space = replay_space(target)
    own = dict((options or {}).get(strategy, {}))
    if fast and strategy in SAMPLERS:
        own.setdefault("incremental", True)
    strat = strategies.get(strategy, space, seed, **own)
    budget = Budget(total_s=budget_s, clock=target.now)
    obs = _ReachObserver(table, target, strat, space)
    loop = SearchLoop(MemoryStore(), target, space, strat, budget,
                      LoopSettings(study_name=f"bench-{strategy}-{seed}", handle_sigint=False),
                      observer=obs)
    result = loop.run()
    obs.stopped()
    own = result.stop_reason.removeprefix("strategy stopped: ")
    # its own judgement: not "the space is exhausted", not "the budget cannot fit the next trial"
    stopped = own != result.stop_reason and "exhausted" not in own and not own.startswith("budget")
    return RunStats(table=table.path.name, strategy=strategy, seed=seed,
                    reach_s=obs.reach_s if obs.reach_s is not None else math.inf,
                    best_frac=obs.best_frac, trials=obs.trials, elapsed_s=target.now(),
                    stopped_early=stopped and target.now() < budget_s, stop_reason=result.stop_reason,
                    wall_s=time.perf_counter() - t0, calib_inside=obs.calib_inside, calib_n=obs.calib_n,
                    cost_within=obs.cost_within, cost_n=obs.cost_n)


def default_budget_s(table: ReplayTable) -> float:
    """The side-car's `budget_s` when the table names one (the H200 decode table: its live check's
    scale, whose best rows sit behind minute-long compiles); else a tenth of what measuring every row
    once would take (restarts not counted), and at least what 40 typical trials take (a restart of the
    median knob, compile, measurement): long enough for every strategy to get near, short enough that
    exhausting a large table is not an option."""
    if table.meta.get("budget_s"):
        return float(table.meta["budget_s"])
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
          options: dict[str, dict[str, Any]] | None = None, progress: str | Path | None = None,
          first_seed: int = 0) -> dict[str, Any]:
    """Every strategy on every table, seeds first_seed..first_seed+seeds-1 (a strategy developed on
    some seeds is reported on others). Runs go seed by seed (every table and strategy of the first
    seed first), and `progress` (a file) gets each finished run as a JSON line at once: a long
    benchmark stopped early still says what it measured."""
    t0 = time.perf_counter()
    jobs, budgets = [], {}
    for path in tables:
        table = _table(str(path))
        budgets[table.path.name] = budget_s if budget_s is not None else default_budget_s(table)
    for seed in range(first_seed, first_seed + seeds):
        for path in tables:
            for strategy in strategies:
                jobs.append((str(path), strategy, seed, budgets[_table(str(path)).path.name], options or {}))
    out = open(progress, "a") if progress else None
    runs: list[RunStats] = []
    try:
        if workers > 1:
            import multiprocessing as mp

            with mp.get_context("fork").Pool(workers) as pool:
                for r in pool.imap_unordered(_job, jobs, chunksize=1):
                    runs.append(_record(r, out))
        else:
            runs = [_record(_job(j), out) for j in jobs]
    finally:
        if out is not None:
            out.close()
    runs.sort(key=lambda r: (r.table, r.strategy, r.seed))
    return {"runs": [asdict(r) for r in runs], "summary": summarize(runs, budgets),
            "budgets_s": budgets, "seeds": seeds, "first_seed": first_seed, "strategies": list(strategies),
            "seeds_by_table": {name: seeds for name in budgets},
            "tables": {_table(str(p)).path.name: _table_info(_table(str(p))) for p in tables},
            "wall_s": time.perf_counter() - t0}


def _record(run: RunStats, out: Any) -> RunStats:
    if out is not None:
        import json

        out.write(json.dumps(to_json(asdict(run))) + "\n")
        out.flush()
    return run


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several bench() results (tables run with their own seeds and budgets) as one."""
    out: dict[str, Any] = {"runs": [], "summary": {}, "budgets_s": {}, "tables": {}, "seeds_by_table": {},
                           "strategies": [], "wall_s": 0.0}
    for r in results:
        out["runs"] += r["runs"]
        for key in ("summary", "budgets_s", "tables", "seeds_by_table"):
            out[key].update(r[key])
        out["strategies"] += [s for s in r["strategies"] if s not in out["strategies"]]
        out["wall_s"] += r["wall_s"]
    out["seeds"] = max(out["seeds_by_table"].values(), default=0)
    return out


def _table_info(t: ReplayTable) -> dict[str, Any]:
    best = t.optimum()
    return {"path": str(t.path), "sha256": t.sha256, "rows": len(t.rows), "valid": len(t.valid_rows()),
            "objective": t.objective, "direction": "minimize" if t.minimize else "maximize",
            "optimum": best.value, "optimum_config": best.config,
            "within_1pct": sum(1 for r in t.valid_rows() if t.score(r.value) >= (1 - WITHIN) * t.score(best.value)),
            "oracle_reach_s": oracle_reach_s(t)}


def oracle_reach_s(t: ReplayTable) -> float:
    """The fastest any strategy can reach within 1%: the baseline measured, then straight to the
    cheapest row within 1% of the optimum (what puts a strategy's reach in scale: a table whose
    optimum sits behind a long compile has a floor no search gets under)."""
    from autoopt.targets.base import EvalRequest

    best = t.score(t.optimum().value)
    near = [r for r in t.valid_rows() if t.score(r.value) >= (1 - WITHIN) * best]
    times = []
    for row in near:
        target = ReplayTarget(t)
        target.evaluate(EvalRequest(config=t.baseline(), concurrency=(target.concurrency,)))
        if dict(row.config) != t.baseline():
            target.evaluate(EvalRequest(config=dict(row.config), concurrency=(target.concurrency,)))
        times.append(target.now())
    return min(times)


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
            stopped = [r for r in rs if r.stopped_early]
            calib_n, cost_n = sum(r.calib_n for r in rs), sum(r.cost_n for r in rs)
            summary[table][strategy] = {
                "runs": len(rs), "reached": sum(1 for r in rs if math.isfinite(r.reach_s)),
                "stopped_within_1pct": sum(1 for r in stopped if r.best_frac >= 1.0 - WITHIN),
                "stopped_best_frac_median": statistics.median(r.best_frac for r in stopped) if stopped else None,
                "calibration": sum(r.calib_inside for r in rs) / calib_n if calib_n else None,
                "calibration_trials": calib_n,
                "cost_within_50pct": sum(r.cost_within for r in rs) / cost_n if cost_n else None,
                "reach_s_median": med, "reach_s_q1": q1, "reach_s_q3": q3,
                "reach_s_runs": [r.reach_s for r in sorted(rs, key=lambda r: r.seed)],  # for intervals
                "best_frac_median": bmed, "best_frac_q1": b1, "best_frac_q3": b3,
                "stopped_early": len(stopped),
                "elapsed_s_median": statistics.median(r.elapsed_s for r in rs),
                "trials_median": statistics.median(r.trials for r in rs),
                "wall_s_mean": statistics.fmean(r.wall_s for r in rs), "budget_s": budgets[table]}
    return summary


def _t(s: float) -> str:
    return format_duration(s) if math.isfinite(s) else "never"


def render(result: dict[str, Any]) -> str:
    lines = []
    for table, by_strategy in result["summary"].items():
        info = result["tables"][table]
        seeds = result.get("seeds_by_table", {}).get(table, result["seeds"])
        lines.append(f"{table}: {info['valid']} valid rows, optimum {info['objective']}={info['optimum']:g} "
                     f"({info['within_1pct']} rows within 1%), budget {_t(result['budgets_s'][table])} "
                     f"simulated, {seeds} seeds; oracle {_t(info.get('oracle_reach_s', math.nan))} (the "
                     "baseline, then straight to the optimum)")
        lines.append(f"  {'strategy':<8} {'reach 1% (median [IQR])':<26} {'reached':>8} "
                     f"{'best at end':>12} {'stopped (<=1%, best)':>21} {'calib':>6} {'cost':>5} "
                     f"{'trials':>7} {'wall/run':>9}")
        for strategy, s in by_strategy.items():
            reach = f"{_t(s['reach_s_median'])} [{_t(s['reach_s_q1'])}, {_t(s['reach_s_q3'])}]"
            stop = f"{s['stopped_early']} ({s['stopped_within_1pct']}, " \
                   f"{_pct(s['stopped_best_frac_median'])})" if s["stopped_early"] else "0"
            lines.append(f"  {strategy:<8} {reach:<26} {s['reached']:>4}/{s['runs']:<3} "
                         f"{100 * s['best_frac_median']:>11.1f}% {stop:>21} {_pct(s['calibration']):>6} "
                         f"{_pct(s['cost_within_50pct']):>5} {s['trials_median']:>7.0f} {s['wall_s_mean']:>8.2f}s")
        lines += _ratio_lines(by_strategy)
    lines.append(f"(wall {result['wall_s']:.1f}s; reach = simulated time until the "
                 "strategy's best is truly within 1% of the table's optimum; never = not within the budget; "
                 "stopped = runs that stopped themselves (of them within 1%, their median best); calib = "
                 "trials inside their predicted 95% interval; cost = transitions predicted within 50%)")
    return "\n".join(lines)


def _ratio_lines(by_strategy: dict[str, dict[str, Any]], reference: str = "agent") -> list[str]:
    """The reference's median reach over each other strategy's, with the 95 % bootstrap interval over
    the seeds (autoopt.stats.median_ratio): whether a difference is a result or the seeds' scatter."""
    from autoopt.stats import median_ratio

    ref = by_strategy.get(reference, {}).get("reach_s_runs")
    out = []
    for other, s in by_strategy.items():
        if other == reference or not ref or not s.get("reach_s_runs"):
            continue
        r = median_ratio(ref, s["reach_s_runs"])
        out.append(f"  {reference}/{other} reach: {r.text()}, {reference} faster in "
                   f"{100 * r.share_below_1:.0f}% of the resamples")
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def to_json(x: Any) -> Any:
    """The result as JSON-ready data: inf -> "inf" (JSON has no infinity)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): to_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_json(v) for v in x]
    return x
