"""autoopt best: the best trial outside the noise, optionally exported as config.yaml with evidence."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from autoopt.cli.app import app
from autoopt.cli.history_cmd import DB_HELP, STUDY_HELP


@app.command("best", epilog="Examples:\n\n  autoopt best\n\n  autoopt best --study flash-h200 --objective tok_per_s@16 --json\n\n  autoopt best --export config.yaml")
def best_command(
    study: Optional[str] = typer.Option(None, "--study", help=STUDY_HELP),
    objective: Optional[str] = typer.Option(
        None, "--objective", help="tok_per_s@C (default: the concurrency the run declared)."),
    export: Optional[Path] = typer.Option(None, "--export", help="Write the winner's config + evidence (YAML)."),
    trial: Optional[str] = typer.Option(None, "--trial", help="Take this trial instead of the rule's choice."),
    as_json: bool = typer.Option(False, "--json", help="Print the best document as JSON."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """The best trial: highest tok/s whose 95% CI low end clears the baseline's CI high end."""
    from autoopt.cli.render_history import print_json, render_best, warn
    from autoopt.export import build_export, write_export
    from autoopt.store import Store
    from autoopt.store.reports import best

    with Store.open(db, create=False) as store:
        doc, chosen, baseline = best(store, study, objective=objective, trial=trial)
        run = next((r for r in store.runs(chosen.study) if r.id == chosen.run_id), None)
    if export is not None:
        writer = write_export(export, build_export(chosen, baseline, run))
        doc["export"] = {"path": str(export), "writer": writer}
    warn(doc["warnings"])
    if as_json:
        print_json(doc)
    else:
        render_best(doc)
