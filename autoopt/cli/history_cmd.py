"""autoopt history: every trial of a study, one line each (objective with CI, speed-up, cost, why).

Parses, calls autoopt.store.reports.history, renders (or prints its JSON, shape in db/README.md).
"""
from __future__ import annotations

from typing import Optional

import typer

from autoopt.cli.app import app

DB_HELP = "Database URL or SQLite path (default: $AUTOOPT_DB, else db/autoopt.sqlite)."
STUDY_HELP = "Study name (default: the most recently active study in the database)."


@app.command("history", epilog="Examples:\n\n  autoopt history\n\n  autoopt history --sort objective --limit 10\n\n  autoopt history --failed --json")
def history_command(
    study: Optional[str] = typer.Option(None, "--study", help=STUDY_HELP),
    sort: str = typer.Option("number", "--sort", help="objective (best first) | number | time (newest first)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Show at most N trials (after sorting)."),
    failed: bool = typer.Option(False, "--failed", help="Only failed, wrong and interrupted trials."),
    objective: Optional[str] = typer.Option(None, "--objective", help="e.g. tok_per_s@16 or tok_per_s@mix (default: the run's objective)."),
    as_json: bool = typer.Option(False, "--json", help="Print the history document as JSON."),
    wide: bool = typer.Option(False, "--wide", help="One line per trial at full width (no wrapping; "
                              "the terminal may cut it). Default: long cells wrap to fit."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """List the trials of a study with their objective, 95% CI and speed-up over the baseline."""
    from autoopt.cli.render_history import print_json, render_history
    from autoopt.store.reading import open_for_reading
    from autoopt.store.reports import history

    with open_for_reading(db) as store:
        if objective:
            require_measured(store, store.resolve_study(study), objective)
        doc = history(store, study, sort=sort, limit=limit, failed_only=failed, objective=objective)
    if as_json:
        print_json(doc)
    else:  # the trial `autoopt best` takes, marked when it beats its baseline outside the noise
        render_history(doc, best_number=doc["best_number"] if doc["best_significant"] else None, wide=wide)


def require_measured(store, study: str, objective: str) -> None:
    """UserError when --objective names a concurrency no trial of `study` was measured at."""
    from autoopt.errors import UserError
    from autoopt.store.analysis import measured_concurrencies, parse_objective

    _, c = parse_objective(objective)
    measured = measured_concurrencies(store.trials(study, with_samples=False))
    if isinstance(c, int) and measured and c not in measured:
        have = ", ".join(f"tok_per_s@{m}" for m in measured)
        raise UserError(f"--objective {objective}: study {study!r} has no trial measured at "
                        f"concurrency {c}; it has {have}")

