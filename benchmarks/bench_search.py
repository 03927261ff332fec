"""How fast do the search strategies get within 1% of the optimum on recorded tables? Runs
`autoopt bench-search` (agent, tpe, random, grid; 20 seeds; simulated clock) on benchmarks/data/*.csv
and writes benchmarks/results/bench_search.json with machine, versions, date, the tables' sha256 and
every run. Also checks the agent's commit target on each table: median time to within 1% at most
0.5x TPE's and 0.3x random's, and its stop rule firing on its own before the budget.

    python benchmarks/bench_search.py                       # the recorded tables in benchmarks/data
    python benchmarks/bench_search.py --synthetic           # + the SYNTHETIC tables of tests/fixtures
    python benchmarks/bench_search.py TABLE ... --seeds 5   # any tables
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _meta import machine_meta, write_result  # noqa: E402

HERE = Path(__file__).resolve().parent
SYNTHETIC = sorted(p for p in (HERE.parent / "tests" / "fixtures" / "replay").iterdir()
                   if p.suffix in (".csv", ".json"))  # the Kernel Tuner cache too


def targets(summary: dict, budgets: dict) -> dict:
    """Per table: the agent's reach over TPE's and random's (median; inf = never), and whether the
    commit target holds."""
    out = {}
    for table, by in summary.items():
        agent = by.get("agent")
        if agent is None:
            continue
        row = {"agent_reach_s": agent["reach_s_median"],
               "agent_stopped_itself": f"{agent['stopped_early']}/{agent['runs']}"}
        ok = math.isfinite(agent["reach_s_median"]) and agent["stopped_early"] == agent["runs"]
        for other, limit in (("tpe", 0.5), ("random", 0.3)):
            if other in by:
                theirs = by[other]["reach_s_median"]
                ratio = agent["reach_s_median"] / theirs if math.isfinite(theirs) else 0.0
                row[f"ratio_vs_{other}"] = ratio
                row[f"{other}_reach_s"] = theirs
                ok = ok and ratio <= limit
        row["target_met"] = ok
        out[table] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tables", nargs="*", help="default: benchmarks/data/*.csv")
    ap.add_argument("--synthetic", action="store_true", help="add tests/fixtures/replay/*.csv (synthetic)")
    ap.add_argument("--strategies", default="agent,tpe,random,grid")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=None, help="simulated seconds per run "
                    "(default: a tenth of measuring every row once, at least 40 typical trials)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results" / "bench_search.json"))
    args = ap.parse_args()

    from autoopt.bench_search import bench, render, to_json

    tables = [Path(t) for t in args.tables] or sorted((HERE / "data").glob("*.csv"))
    if args.synthetic:
        tables += SYNTHETIC
    if not tables:
        sys.exit("no tables: benchmarks/data/ has no *.csv yet (give tables, or --synthetic)")
    t0 = time.perf_counter()
    result = bench([str(t) for t in tables], tuple(args.strategies.split(",")), args.seeds,
                   args.budget_s, workers=args.workers)
    print(render(result))
    checks = targets(result["summary"], result["budgets_s"])
    for table, row in checks.items():
        vs = ", ".join(f"{k[9:]} {v:.2f}x" for k, v in row.items() if k.startswith("ratio_vs_"))
        print(f"{table}: agent vs {vs}; stopped itself {row['agent_stopped_itself']}; "
              f"target {'met' if row['target_met'] else 'NOT met'}")
    synthetic = {str(p) for p in SYNTHETIC}
    payload = {"benchmark": "bench_search", "machine": machine_meta(),
               "command": " ".join(sys.argv), "wall_s": time.perf_counter() - t0,
               "synthetic_tables": [t.name for t in tables if str(t.resolve()) in synthetic],
               "targets": checks, "result": result}
    path = write_result(args.out, to_json(payload))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
