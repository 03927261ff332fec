"""autoopt bench-search: every strategy on every replay table, many seeds, on the simulated clock.

Parsing and rendering only; the work is autoopt.search.bench (no torch anywhere).
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
    tables: Optional[List[Path]] = typer.Argument(None, help="Replay tables: CSV, JSON lines, Kernel Tuner "
                                                  "caches or T4 files, each may be gzipped (a "
                                                  "TABLE.restart.yaml beside one gives restart costs)."),
    landscapes: Optional[Path] = typer.Option(None, "--landscapes", help="Also every DIR/*.json.gz "
                                              "(e.g. ../shared/landscapes: real GPU landscapes)."),
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
    counted honestly), the best found at the end, how many runs the strategy stopped itself (and how
    many of those within 1%), the agent's calibration (trials inside their predicted 95% interval), the
    cost model's (transitions predicted within 50%), and the agent's median over each other strategy's
    with its 95% bootstrap interval over the seeds.

    Examples:

      autoopt bench-search tests/fixtures/replay/casestudy.csv --seeds 5

      autoopt bench-search benchmarks/data/*.csv --strategies agent,tpe --json

      autoopt bench-search --landscapes ../shared/landscapes --seeds 10 --budget 15m
    """
    from autoopt.search import registry
    from autoopt.search.bench import bench, render, to_json
    from autoopt.units import parse_duration
    from autoopt.errors import UserError

    names = tuple(s.strip() for s in strategies.split(",") if s.strip())
    unknown = [s for s in names if s not in registry.names()]
    if not names or unknown:
        raise UserError(f"--strategies: unknown {unknown or 'none given'} "
                        f"(expected some of: {', '.join(registry.names())})")
    budget_s = parse_duration(budget) if budget is not None else None
    paths = [str(t) for t in tables or []]
    if landscapes is not None:
        found = sorted(landscapes.glob("*.json.gz"))
        if not found:
            raise UserError(f"--landscapes {landscapes}: no *.json.gz there")
        paths += [str(p) for p in found]
    if not paths:
        raise UserError("bench-search: give replay tables or --landscapes DIR")
    result = bench(paths, names, seeds, budget_s, workers=workers)
    if as_json:
        typer.echo(json.dumps(to_json(result), indent=1, sort_keys=True))
    else:
        typer.echo(render(result))

