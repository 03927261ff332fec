"""autoopt show: one trial in full (config, per-C figures with CI, buckets, costs, why chosen,
predicted vs actual, failure reason and stderr tail)."""
from __future__ import annotations

from typing import Optional

import typer

from autoopt.cli.app import app
from autoopt.cli.history_cmd import DB_HELP, STUDY_HELP


@app.command("show", epilog="Examples:\n\n  autoopt show 12\n\n  autoopt show 0 --study dsv4_tiny_cpu --json")
def show_command(
    trial: str = typer.Argument(..., help="Trial number (e.g. 12) or Optuna trial id (id:345)."),
    study: Optional[str] = typer.Option(None, "--study", help=STUDY_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the trial document as JSON."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Show one trial: what ran, how fast (with CI), where the time went, why it was chosen."""
    from autoopt.cli.render_history import print_json, render_show
    from autoopt.store.reading import open_for_reading
    from autoopt.store.reports import show

    with open_for_reading(db) as store:
        doc = show(store, trial, study)
    if as_json:
        print_json(doc)
    else:
        render_show(doc)
