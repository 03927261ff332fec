"""autoopt bench-search: every strategy on every replay table, many seeds, on the simulated clock.

Parsing and rendering only; the work is autoopt.bench_search (no torch anywhere).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional

import typer

from autoopt.cli.app import app


@app.command("bench-search")
def bench_search(
    tables: List[Path] = typer.Argument(..., help="Replay tables: CSV, JSON lines or Kernel Tuner cache "
                                        "files (a TABLE.restart.yaml beside one gives restart costs)."),
    strategies: str = typer.Option("agent,tpe,random,grid", "--strategies", help="Comma-separated "
                                   "strategy names (see `autoopt run --help`)."),
    seeds: int = typer.Option(20, "--seeds", min=1, help="Runs per table and strategy (seeds 0..N-1)."),
    budget: Optional[str] = typer.Option(None, "--budget", "-b", help="Simulated budget per run: 90m, "
                                         "4h, ... Default: a tenth of measuring every row once, at "
                                         "least 40 typical trials."),
    workers: int = typer.Option(min(2, os.cpu_count() or 1), "--workers", "-j", min=1,
                                help="Processes to spread the runs over."),
    as_json: bool = typer.Option(False, "--json", help="Print the full result (every run) as JSON."),
) -> None:
    """Benchmark the search strategies on recorded tables: per table and strategy, the median and IQR
    of simulated time until the strategy's best is truly within 1% of the table's optimum ("never"
    counted honestly), the best found at the end, and how many runs the strategy stopped itself.

    Examples:

      autoopt bench-search tests/fixtures/replay/casestudy.csv --seeds 5

      autoopt bench-search benchmarks/data/*.csv --strategies agent,tpe --json
    """
    from autoopt import strategies as registry
    from autoopt.bench_search import bench, render, to_json
    from autoopt.budget import parse_duration
    from autoopt.errors import UserError

    names = tuple(s.strip() for s in strategies.split(",") if s.strip())
    unknown = [s for s in names if s not in registry.names()]
    if not names or unknown:
        raise UserError(f"--strategies: unknown {unknown or 'none given'} "
                        f"(expected some of: {', '.join(registry.names())})")
    budget_s = parse_duration(budget) if budget is not None else None
    result = bench([str(t) for t in tables], names, seeds, budget_s, workers=workers)
    if as_json:
        typer.echo(json.dumps(to_json(result), indent=1, sort_keys=True))
    else:
        typer.echo(render(result))

