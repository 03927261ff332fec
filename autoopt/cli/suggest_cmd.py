"""autoopt suggest: the next trial of a study for an outside agent (printing only; the work is
autoopt.search.suggest). It states the study's objective (analysis.ObjectiveUnit: tok/s, or a replayed
table's column such as a time in ms, lower is better), and a replay study's space, which lived in a
temporary file, is rebuilt from its table as `autoopt run --resume` rebuilds it."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from autoopt.cli.app import app
from autoopt.cli.history_cmd import DB_HELP, STUDY_HELP

EPILOG = ("The agent strategy proposes on the study's history (its gain model, the one cost model, "
          "the stop rule); nothing is measured and nothing is written to the study. Run the trial, "
          "then `autoopt record` its result. Exit codes: 0 = a suggestion or the advice to stop; 2 = "
          "no such study, or its space file is gone. Examples:\n\n  autoopt suggest --study mhc\n\n"
          "  autoopt suggest --study mhc --json --min-gain 0.5%/10min")


MIN_GAIN = typer.Option(None, "--min-gain", help="The stop rule, GAIN%/TIME (default 1%/10min).")
BUDGET_LEFT = typer.Option(None, "--budget-left", help="Time you still mean to spend (default 1h).")


@app.command("suggest", epilog=EPILOG)
def suggest_command(
    study: Optional[str] = typer.Option(None, "--study", help=STUDY_HELP),
    space: Optional[str] = typer.Option(None, "--space", help="Space file (default: the study's)."),
    min_gain: Optional[str] = MIN_GAIN,
    budget_left: Optional[str] = BUDGET_LEFT,
    as_json: bool = typer.Option(False, "--json", help="Print the suggestion as JSON."),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
) -> None:
    """The next trial to run (its knobs, reason, expected gain and cost), or why to stop."""
    from autoopt.cli.render_history import print_json
    from autoopt.search.suggest import suggest
    from autoopt.store import Store
    from autoopt.store.analysis import objective_unit
    from autoopt.units import parse_duration

    left_s = parse_duration(budget_left) if budget_left else None
    with Store.open(db, create=False) as store:
        name = store.resolve_study(study)
        advice = suggest(store, name, _space(store, name, space), min_gain, left_s)
        unit = objective_unit(store.trials(name, ("ok", "wrong", "failed"), with_samples=False))
    if as_json:
        print_json({"study": name, "writes": "nothing (a suggestion; record the trial's result with "
                                             "autoopt record)", "objective_unit": unit.to_json()} | advice.to_json())
        return
    # the agent's gains are speed-ups of the stored figure: for a minimised time, time / (1 + gain)
    gains = "; expected gains are speed-ups (the time divided by 1 + gain)" if unit.reciprocal else ""
    print(f"study {name}: {advice.line}")
    print(f"why: {advice.reason}")
    print(f"objective: {unit.describe()}{gains}")


def _space(store: Any, study: str, given: Optional[str]) -> Any:
    """The study's space (autoopt.search.suggest.study_space), or for a study its last run made from a
    replay table alone (no space file of its own), that table's space."""
    from autoopt.errors import UserError
    from autoopt.search.suggest import study_space

    runs = store.runs(study) if given is None and study in store.studies() else []
    last = (runs[-1].settings or {}) if runs else {}
    spec, path = str(last.get("target_spec") or ""), last.get("space_path")
    if not spec.startswith("replay:") or (path and Path(path).is_file()):
        return study_space(store, study, given)
    from autoopt.targets.replay.target import from_spec, replay_space

    try:
        return replay_space(from_spec(spec))
    except (OSError, ValueError, UserError) as exc:
        raise UserError(f"study {study!r}: {exc} (a study run on a replay table alone takes its space "
                        "from that table; or give --space FILE)") from None
