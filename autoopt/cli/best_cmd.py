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
        None, "--objective", help="tok_per_s@C or tok_per_s@mix (default: the run's objective; the weighted mix when its space weighs several concurrencies)."),
    export: Optional[Path] = typer.Option(None, "--export", help="Write the winner's config + evidence (YAML)."),
    trial: Optional[str] = typer.Option(None, "--trial", help="Take this trial instead of the rule's choice."),
    as_json: bool = typer.Option(False, "--json", help="Print the best document as JSON."),
    force: bool = typer.Option(False, "--force", help="With --trial N: export N even when its "
                               "confirmation leaves the win in doubt: it failed, or it disagrees with the "
                               "trial and one of the two does not beat the baseline outside the noise (the "
                               "warning goes into the export too). Without --trial the rule leaves such a "
                               "trial out and takes the best whose win holds."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """The best trial: among trials whose 95% CI low end clears their run's baseline's CI high end, the
    fastest (runs on one machine) or the highest speed-up over its run's baseline (runs on several),
    shown in the objective's unit (tok/s, higher is better; a replayed time in ms, lower is better).
    A trial whose re-measurement disagrees with it and leaves the win in doubt is left out, with a warning."""
    from autoopt.cli.render_history import print_json, render_best, warn
    from autoopt.store.analysis import key_of
    from autoopt.store.export import build_export
    from autoopt.targets.builtin.config_file import write_export
    from autoopt.targets.server.export import is_server_run, write_server_export
    from autoopt.store import Store
    from autoopt.store.reports import best

    from autoopt.cli.history_cmd import require_measured

    with Store.open(db, create=False) as store:
        if objective:
            require_measured(store, store.resolve_study(study), objective)
        doc, chosen, baseline = best(store, study, objective=objective, trial=trial)
        run = next((r for r in store.runs(chosen.study) if r.id == chosen.run_id), None)
    if export is not None and doc["export_refused"] and not force:
        from autoopt.errors import UserError

        warn(doc["warnings"])
        raise UserError(f"--export {export}: not exporting trial {chosen.number}: {doc['export_refused']} "
                        "(pass --force to export it anyway)")
    if export is not None:  # the evidence names the objective the trial was chosen on
        exported = {**build_export(chosen, baseline, run, objective=key_of(doc)), "warnings": list(doc["warnings"])}
    if export is not None and is_server_run(run):  # the winning launch: command line, env, config file
        write_server_export(export, exported, run)
        doc["export"] = {"path": str(export), "writer": "autoopt.targets.server.export"}
    elif export is not None:
        write_export(export, exported)
        doc["export"] = {"path": str(export), "writer": "autoopt.targets.builtin.config_file"}
    warn(doc["warnings"])
    if as_json:
        print_json(doc)
    else:
        render_best(doc)
