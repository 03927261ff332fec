"""autoopt run: search a space under a wall-time budget, record every trial, print the best.

Parsing and rendering only; the work is autoopt.search.session / autoopt.search.loop. torch is imported by the
target's worker process, never here.
"""
from __future__ import annotations

import json
import shlex
import sys
from typing import Any, Optional

import typer

from autoopt.cli.app import app

EPILOG = ("Exit codes: 0 = finished (budget spent, --max-trials reached, or the strategy judged no "
          "further trial worth it); 1 = finished but every trial of this run failed (and no run beside it "
          "measured a baseline that worked); 2 = bad input or "
          "infrastructure (unreadable or invalid space file, unknown knob/strategy/target, bad "
          "--budget, unreachable database); 130 = interrupted by Ctrl-C (what finished is recorded, "
          "the running trial as interrupted; run again to continue); 143 / 129 = the same, stopped by "
          "SIGTERM / SIGHUP.")


# The command's options, declared once here so that `run` itself stays a page long.
SPACE = typer.Option(None, "--space", "-s", help="Space name (see `autoopt spaces`) or YAML file. "
                     "Default: dsv4_flash_decode where an NVIDIA GPU is visible, else dsv4_tiny_cpu (the "
                     "run says which and why).")
TARGET = typer.Option(None, "--target", help="builtin (dsv4 decode step in a worker) or replay:TABLE. "
                      "Default: the space file's target.")
PRESET = typer.Option(None, "--preset", help="Model preset (tiny, flash-slice, pro-slice). Default: the "
                      "space file's.")
DEVICE = typer.Option(None, "--device", help="cpu | cuda | auto. Default: the space file's.")
BUDGET = typer.Option(None, "--budget", "-b", help="Wall time, restarts included: 90s, 2m, 2h, 1h30m. "
                      "Default: 2h.")
MAX_TRIALS = typer.Option(None, "--max-trials", "-n", help="At most N trials in this run (baseline and "
                          "re-runs included; the final confirmation of the best is extra).")
STUDY = typer.Option(None, "--study", help="Study name. Default: the space's name. An existing study is "
                     "continued.")
DB = typer.Option(None, "--db", help="Database URL or SQLite path. Default: $AUTOOPT_DB, else "
                  "db/autoopt.sqlite.")
SEED = typer.Option(None, "--seed", help="Seed of the strategy's sampler (recorded).")
RESUME = typer.Option(False, "--resume", help="Continue --study (default: the most recently active "
                      "study) with the settings its last run recorded.")
STRATEGY = typer.Option(None, "--strategy", help="agent | grid | tpe | random | gp. Default: agent.")
MIN_GAIN = typer.Option(None, "--min-gain", help="The agent's stop rule, GAIN%/TIME: it stops by itself "
                        "when no candidate is expected to win at least GAIN per TIME of restart + "
                        "measurement (e.g. 1%/10min, 0.5%/5m, 2%/h; 0 = never stop for lack of gain). "
                        "Default: 1%/10min.")
OBJECTIVE = typer.Option(None, "--objective", help="Replay target: the table's objective column "
                         "(default: the side-car YAML's, else tok_per_s / time).")
MINIMIZE = typer.Option(None, "--minimize/--maximize", help="Replay target: the objective's direction "
                        "(default: the side-car YAML's).")
MEASURE_S = typer.Option(None, "--measure-s", help="Replay target: simulated seconds of one measurement "
                         "for rows without measure_s.")
RESTART_S = typer.Option([], "--restart-s", help="Replay target: KNOB=SECONDS, the simulated cost of "
                         "switching KNOB (repeatable; wins over the side-car YAML).")
CONFIRM = typer.Option(True, "--confirm/--no-confirm", help="Re-measure the best at the end (a budget "
                       "reserve is kept for it).")
MEASURE_LOCK = typer.Option(True, "--measure-lock/--no-measure-lock", help="Take turns measuring with the "
                            "other autoopt runs on this host (a lock file in $XDG_RUNTIME_DIR or the temp "
                            "directory; on PostgreSQL an advisory lock keyed by the host name), so no two "
                            "time their trials on the same cores or GPU at once. Default: on.")
REPLAY_PACE_S = typer.Option(None, "--replay-pace-s", help="Replay target: each evaluation also waits this "
                             "many real seconds (to rehearse runs side by side; the budget stays simulated).")
WARM_START = typer.Option(None, "--warm-start", help="Start the agent from another study's measured "
                          "effects (another preset, GPU or the CPU): its successful trials on the knobs both "
                          "spaces share enter the agent's model as evidence from elsewhere, discounted, "
                          "never as measurements of this run; dropped once this run shows them wrong. "
                          "--resume repeats it.")
WARM_START_DB = typer.Option(None, "--warm-start-db", help="Database URL or SQLite path of the --warm-start "
                             "study (read only). Default: --db's.")
JSON = typer.Option(False, "--json", help="Print a JSON summary on stdout (progress goes to stderr).")
LIVE = typer.Option(None, "--live/--plain", help="Rich live panel or plain log lines. Default: live on a "
                    "terminal.")


@app.command("run", epilog=EPILOG)
def run(
    space: Optional[str] = SPACE, target: Optional[str] = TARGET, preset: Optional[str] = PRESET,
    device: Optional[str] = DEVICE, budget: Optional[str] = BUDGET, max_trials: Optional[int] = MAX_TRIALS,
    study: Optional[str] = STUDY, db: Optional[str] = DB, seed: Optional[int] = SEED, resume: bool = RESUME,
    strategy: Optional[str] = STRATEGY, min_gain: Optional[str] = MIN_GAIN,
    objective: Optional[str] = OBJECTIVE, minimize: Optional[bool] = MINIMIZE,
    measure_s: Optional[float] = MEASURE_S, restart_s: list[str] = RESTART_S, confirm: bool = CONFIRM,
    measure_lock: bool = MEASURE_LOCK, replay_pace_s: Optional[float] = REPLAY_PACE_S,
    warm_start: Optional[str] = WARM_START, warm_start_db: Optional[str] = WARM_START_DB, as_json: bool = JSON, live: Optional[bool] = LIVE,
) -> None:
    """Search the space: baseline first, then the strategy's proposals until the budget, --max-trials
    or the strategy says stop; re-measure the best; print it with its CI and speed-up.

    Examples:

      autoopt run --budget 2m

      autoopt run --space dsv4_flash_decode --budget 2h --study flash-h200

      autoopt run --budget 30m --min-gain 0.5%/5m

      autoopt run --resume

      autoopt run --budget 1h --study flash-h200 --warm-start flash-a100

      autoopt run --budget 1h --warm-start flash-a100 --warm-start-db a100.sqlite

      autoopt run --target replay:benchmarks/data/tiny_cpu_grid.csv --budget 30m --restart-s attention=45
    """
    from autoopt.cli.live_view import LiveView
    from autoopt.search.session import RunOptions, execute, parse_restart_s, summary

    opts = RunOptions(space=space, target=target, preset=preset, device=device, budget=budget,
                      max_trials=max_trials, study=study, db=db, seed=seed, resume=resume,
                      strategy=strategy, confirm=confirm, min_gain=min_gain,
                      replay={"objective": objective, "minimize": minimize, "measure_s": measure_s,
                              "restart_s": parse_restart_s(restart_s)},
                      measure_lock=measure_lock, replay_pace_s=replay_pace_s,
                      warm_start=warm_start, warm_start_db=warm_start_db,
                      command_line=shlex.join(["autoopt", *sys.argv[1:]]))
    observer = LiveView(live=False if as_json else live)
    try:
        result = execute(opts, observer=observer)
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C); run the same command again to continue", file=sys.stderr)
        raise typer.Exit(130)
    if as_json:
        print(json.dumps(_json_summary(result, summary(result)), indent=2, default=str))
    else:
        _print_result(result)
    raise typer.Exit(result.exit_code)


def _print_result(result: Any) -> None:
    from rich.console import Console

    from autoopt.units import format_duration
    from autoopt.cli.live_view import objective_text, run_unit, speedup_text, status_text

    out = Console(highlight=False, soft_wrap=True)
    unit = run_unit([*result.trials, *result.history])
    n_ok = sum(1 for t in result.trials if t.objective is not None)
    out.print(f"study [bold]{result.study_name}[/bold] (run {result.run_id}): {len(result.trials)} "
              f"trials in {format_duration(result.elapsed_s)} ({n_ok} ok, "
              f"{len(result.trials) - n_ok} failed or wrong)")
    out.print(f"stopped: {result.stop_reason}")
    if result.warm_start is not None:
        out.print(_warm_start_text(result.warm_start))
    accuracy = result.transition_accuracy()
    if accuracy is not None:
        out.print(accuracy.text())
    calibration = result.gain_calibration()
    if calibration is not None:
        out.print(calibration.text())
    base, best, conf = result.baseline, result.best, result.confirmation
    mix = (f"; each figure is the weighted geometric mean of {result.mix} (tok_per_s@mix in best, "
           "history and show)") if result.mix else ""
    out.print(f"objective: {unit.describe()}{mix}", markup=False)
    if base is not None:
        out.print(f"baseline #{base.number}: {objective_text(base, unit)}", markup=False)
    if best is not None:
        changed = {k: v for k, v in best.params.items() if base is None or base.params.get(k) != v}
        if base is not None and best is base:
            out.print(f"best: the baseline #{base.number} (no trial beats it outside the noise: a trial "
                      "counts when its 95% CI low end is above the baseline's CI high end)")
        else:
            confirms = best.decision.confirms if best.decision is not None else None
            of = f" (the confirmation of #{confirms})" if confirms is not None else ""
            out.print(f"best #{best.number}{of}: {objective_text(best, unit)} {speedup_text(best, base)}",
                      style="green", markup=False)
            out.print("  " + (", ".join(f"{k}={v}" for k, v in changed.items()) or "the baseline's configuration"))
    else:
        out.print("[red]no successful trial[/red]")
        for t in result.trials[-3:]:
            out.print(f"  #{t.number}: {status_text(t)}")
    if conf is not None:
        of = conf.decision.confirms if conf.decision is not None else None
        orig = next((t for t in result.history if t.number == of), None)
        out.print(f"confirmation #{conf.number}" + (f" of #{of}" if of is not None else "")
                  + f": {objective_text(conf, unit)} {speedup_text(conf, base)} ({status_text(conf)})", markup=False)
        text = _disagreement_text(orig, conf, base)
        if text:
            out.print(f"[yellow]{text}[/yellow]")
    if result.exit_code == 130:
        out.print("interrupted: run the same command again (or `autoopt run --resume`) to continue")


def _disagreement_text(orig: Any, conf: Any, base: Any) -> str | None:
    """What the run says when its confirmation's CI misses the trial's (the rule `best` applies:
    autoopt.store.analysis.confirmation_verdict); None when they overlap or a CI is missing."""
    from autoopt.store.analysis import confirmation_verdict

    if orig is None or not orig.objective_ci or not conf.objective_ci:
        return None
    base_ci = base.objective_ci if base is not None and base.objective_ci else None
    verdict = confirmation_verdict(tuple(orig.objective_ci), tuple(conf.objective_ci), base_ci, base_ci)
    if verdict is None:
        return None
    refused, why = verdict
    after = (f"; `autoopt best` leaves #{orig.number} out and takes the best whose win holds "
             f"(`--trial {orig.number} --force` exports it)") if refused else ""
    return f"the confirmation disagrees with trial #{orig.number} (the CIs do not overlap){why}{after}"


def _json_summary(result: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """session.summary plus what the objective measures (analysis.ObjectiveUnit.to_json) and each
    trial's figure in that unit (`objective` stays the stored figure: a replayed time's reciprocal)."""
    from autoopt.cli.live_view import run_unit

    unit = run_unit([*result.trials, *result.history])
    for t in [doc["baseline"], doc["best"], doc["confirmation"], *doc["trials"]]:
        if t is not None:
            ci = t["objective_ci"] or [t["objective"], t["objective"]]
            t["objective_value"] = unit.value({"median": t["objective"], "ci_low": ci[0], "ci_high": ci[1]}) \
                if t["objective"] is not None else None
    return {**doc, "objective_unit": unit.to_json()}


def _warm_start_text(warm: dict[str, Any]) -> str:
    where = f" ({warm['db']})" if warm.get("db") else ""
    text = (f"warm start: study {warm['study']!r}{where}, {warm['trials_used']} of its "
            f"{warm['successful_trials']} successful trials ({warm['configurations']} configurations)")
    if warm.get("dropped_after") is not None:
        text += f"; no longer used after trial #{warm['dropped_after']} (its gains missed this run's)"
    return text
