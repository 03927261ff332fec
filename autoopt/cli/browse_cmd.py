"""autoopt browse: a full-screen terminal app over the trial database (autoopt.cli.browse)."""
from __future__ import annotations

from typing import Optional

import typer

from autoopt.cli.app import app
from autoopt.cli.history_cmd import DB_HELP


@app.command("browse", epilog="Examples:\n\n  autoopt browse\n\n  autoopt browse --study flash-h200 "
                              "--db benchmarks/results/h200_study.sqlite\n\nPress ? inside for the keys.")
def browse_command(
    study: Optional[str] = typer.Option(None, "--study", help="Open this study's trials at once "
                                        "(default: the list of studies)."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    poll_s: float = typer.Option(2.0, "--poll-s", help="Re-read the database every N seconds "
                                 "(new trials of a running `autoopt run` appear)."),
) -> None:
    """Browse a study: sort and filter its trials, open one, diff two, plot convergence and knob effects."""
    from autoopt.cli.browse.app import BrowseApp
    from autoopt.errors import UserError
    from autoopt.store.reading import open_for_reading

    if poll_s <= 0:
        raise UserError(f"--poll-s must be positive, got {poll_s}")
    with open_for_reading(db) as store:
        BrowseApp(store, study, poll_s=poll_s).run()

