"""autoopt report: a study as one self-contained HTML page plus PNGs of its plots (autoopt.cli.report)."""
from __future__ import annotations

from typing import Optional

import typer

from autoopt.cli.app import app
from autoopt.cli.history_cmd import DB_HELP, STUDY_HELP


@app.command("report", epilog="Examples:\n\n  autoopt report --out report/\n\n  autoopt report --study "
                              "flash-h200 --db benchmarks/results/h200_study.sqlite --out h200.html")
def report_command(
    out: str = typer.Option(..., "--out", help="FILE.html (PNGs beside it, named FILE-<plot>.png) or a "
                            "directory (report.html and <plot>.png inside; created if missing)."),
    study: Optional[str] = typer.Option(None, "--study", help=STUDY_HELP),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Write a study's report: convergence, per-knob effects, buckets per trial, predicted vs measured, trials."""
    from autoopt.cli.report import build_report
    from autoopt.store.reading import open_for_reading

    with open_for_reading(db) as store:
        files = build_report(store, study, out)
    print(files.html)
    for path in files.pngs.values():
        print(path)
