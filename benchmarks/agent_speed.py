"""The agent's own time per proposal (excluding measuring), with 100 / 250 / 500 trials in the history.

For each history size N: N trials of random configurations of a recorded table are measured by its
replay target (failures included, as they come), then the agent proposes 1 + REPEATS times, each
proposal measured and appended before the next (the steady state of a run: it catches up with one new
trial per proposal). The first proposal catches up with the whole history at once and is reported
apart ("first"); the figure that counts is the median of the others, in wall time (what a run waits)
and in the process's CPU time (what it costs: on a shared machine the wall time also counts the
others' load). --rounds repeats each size with another seed (another history) to show the spread.
Target (issue 14): median at most 100 ms at 500 trials. Writes benchmarks/results/agent_speed.json
with machine, versions, date, load average and the BLAS the agent ran on.

    python benchmarks/agent_speed.py                                   # ../shared/landscapes conv A100
    python benchmarks/agent_speed.py TABLE --sizes 100,250,500 --repeats 15 --rounds 3
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _meta import machine_meta, write_result  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_TABLES = (HERE.parent.parent / "shared" / "landscapes" / "convolution_A100.json.gz",
                  HERE.parent / "tests" / "fixtures" / "replay" / "kt_gemm.json")
TARGET_MS = 100.0


def _outcome(space, target, number, params, decision):
    from autoopt.search.strategy import TrialOutcome
    from autoopt.targets.base import EvalRequest
    from autoopt.trial import TrialResult

    config = space.params_to_config(params)
    t0 = target.now()
    m = target.evaluate(EvalRequest(config, tuple(space.concurrency), min_samples=10))
    obj = space.objective.value(m) if m.status == "ok" else None
    transition_s = sum(m.costs_s.get(k, 0.0) for k in ("restart", "build", "compile"))
    result = TrialResult(m.status, obj, space.objective.ci(m) if obj is not None else None,
                         cost_s=target.now() - t0, transition_s=transition_s)
    return TrialOutcome(number, dict(params), m, result, decision)


def measure(table_path: Path, size: int, repeats: int, seed: int = 0) -> dict:
    from autoopt.search.agent.strategy import AgentStrategy
    from autoopt.search.cost import CostModel
    from autoopt.search.strategy import Decision, SearchContext
    from autoopt.targets.replay.target import ReplayTarget, replay_space

    target = ReplayTarget(table_path, seed=seed)
    space = replay_space(target)
    costs = CostModel(space)
    rng = random.Random(seed)
    history = [_outcome(space, target, 0, space.baseline_params(), None)]
    while len(history) < size:
        params = {p.name: rng.choice(p.choices) for p in space.params}
        history.append(_outcome(space, target, len(history), params, None))
    agent = AgentStrategy(space, seed=seed)
    wall_ms, cpu_ms = [], []
    load = os.getloadavg()[0]
    for _ in range(repeats + 1):
        built = dict(history[-1].params) if history[-1].objective is not None else None
        ctx = SearchContext(space, target, list(history), 1e9, 0.0, built, costs)
        t0, c0 = time.perf_counter(), time.process_time()
        d = agent.propose(ctx)
        wall_ms.append(1000.0 * (time.perf_counter() - t0))
        cpu_ms.append(1000.0 * (time.process_time() - c0))
        if not isinstance(d, Decision):
            break
        history.append(_outcome(space, target, len(history), d.params, d))
    steady, steady_cpu = wall_ms[1:] or wall_ms, cpu_ms[1:] or cpu_ms
    q1, _, q3 = statistics.quantiles(steady, n=4) if len(steady) > 1 else (steady[0],) * 3
    return {"table": table_path.name, "history": size, "seed": seed, "first_ms": wall_ms[0],
            "median_ms": statistics.median(steady), "iqr_ms": [q1, q3], "max_ms": max(steady),
            "median_cpu_ms": statistics.median(steady_cpu), "proposals": len(steady),
            "load_before": load, "load_after": os.getloadavg()[0]}


def _blas() -> list[dict]:
    """The BLAS libraries numpy loaded and their default threads (the agent limits its own to one)."""
    from threadpoolctl import threadpool_info

    return [{k: lib.get(k) for k in ("internal_api", "version", "num_threads", "threading_layer")}
            for lib in threadpool_info() if lib.get("user_api") == "blas"]


def _summary(rows: list[dict]) -> list[dict]:
    """Per history size: the median over rounds of each round's median, and the rounds' range."""
    out = []
    for size in sorted({r["history"] for r in rows}):
        mine = [r for r in rows if r["history"] == size]
        med = [r["median_ms"] for r in mine]
        out.append({"history": size, "rounds": len(mine), "median_ms": statistics.median(med),
                    "round_medians_ms": [min(med), max(med)],
                    "median_cpu_ms": statistics.median(r["median_cpu_ms"] for r in mine),
                    "max_ms": max(r["max_ms"] for r in mine),
                    "first_ms": statistics.median(r["first_ms"] for r in mine)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("table", nargs="?", help="a replay table (default: convolution_A100 of ../shared/landscapes)")
    ap.add_argument("--sizes", default="100,250,500")
    ap.add_argument("--repeats", type=int, default=15, help="proposals timed per size and round")
    ap.add_argument("--rounds", type=int, default=1, help="each size again with the next seed")
    ap.add_argument("--out", default=str(HERE / "results" / "agent_speed.json"))
    args = ap.parse_args()
    table = Path(args.table) if args.table else next(p for p in DEFAULT_TABLES if p.exists())
    load_before = os.getloadavg()[0]  # the machine is shared: what else ran says what a figure means
    rows = [measure(table, int(n), args.repeats, seed) for seed in range(args.rounds)
            for n in args.sizes.split(",")]
    load = {"before": load_before, "after": os.getloadavg()[0], "cpus": os.cpu_count(),
            "blas_threads_env": os.environ.get("OPENBLAS_NUM_THREADS", "default")}
    print(f"{'table':<26} {'history':>7} {'seed':>4} {'first':>8} {'median':>8} {'IQR':>13} {'max':>8} "
          f"{'cpu':>7} {'load':>9}")
    for r in rows:
        print(f"{r['table']:<26} {r['history']:>7} {r['seed']:>4} {r['first_ms']:>6.0f}ms {r['median_ms']:>6.0f}ms "
              f"{r['iqr_ms'][0]:>5.0f}-{r['iqr_ms'][1]:<5.0f}ms {r['max_ms']:>6.0f}ms {r['median_cpu_ms']:>5.0f}ms "
              f"{r['load_before']:>4.1f}-{r['load_after']:<4.1f}")
    summary = _summary(rows)
    big = max(summary, key=lambda r: r["history"])
    ok = big["median_ms"] <= TARGET_MS
    blas = _blas()
    print(f"load average {load['before']:.1f} -> {load['after']:.1f} on {load['cpus']} CPUs; BLAS "
          + ", ".join(f"{b['internal_api']} {b['version']} ({b['num_threads']} threads by default)" for b in blas)
          + ", the agent's own numerics on 1")
    print(f"median at {big['history']} trials: {big['median_ms']:.0f} ms over {big['rounds']} round(s) "
          f"(round medians {big['round_medians_ms'][0]:.0f}-{big['round_medians_ms'][1]:.0f} ms, "
          f"CPU {big['median_cpu_ms']:.0f} ms; target <= {TARGET_MS:.0f} ms): {'met' if ok else 'NOT met'}")
    path = write_result(args.out, {"benchmark": "agent_speed", "machine": machine_meta(),
                                   "command": " ".join(sys.argv), "target_ms": TARGET_MS,
                                   "target_met": ok, "load": load, "blas": blas, "summary": summary,
                                   "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
