"""autoopt diff: two trials side by side (knobs, per-C delta with CI, bucket deltas, verdict)."""
from __future__ import annotations

from typing import Optional

import typer

from autoopt.cli.app import app
from autoopt.cli.history_cmd import DB_HELP, STUDY_HELP


@app.command("diff", epilog="Examples:\n\n  autoopt diff 0 12\n\n  autoopt diff 3 4 --json")
def diff_command(
    a: str = typer.Argument(..., help="Trial A (number, or id:N)."),
    b: str = typer.Argument(..., help="Trial B (number, or id:N)."),
    study: Optional[str] = typer.Option(None, "--study", help=STUDY_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the diff document as JSON."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """Compare trial B against trial A: what changed, what it gained, where the time moved."""
    from autoopt.cli.render_history import print_json, render_diff
    from autoopt.store.reading import open_for_reading
    from autoopt.store.reports import diff

    with open_for_reading(db) as store:
        doc = diff(store, a, b, study)
    if as_json:
        print_json(doc)
    else:
        render_diff(doc)
