"""autoopt run: search a space under a wall-time budget, record every trial, print the best.

Parsing and rendering only; the work is autoopt.run_session / autoopt.loop. torch is imported by the
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
          "further trial worth it); 1 = finished but every trial of this run failed; 2 = bad input or "
          "infrastructure (unreadable or invalid space file, unknown knob/strategy/target, bad "
          "--budget, unreachable database); 130 = interrupted by Ctrl-C (what finished is recorded, "
          "the running trial as interrupted; run again to continue).")


@app.command("run", epilog=EPILOG)
def run(
    space: Optional[str] = typer.Option(None, "--space", "-s", help="Space name (see `autoopt spaces`) "
                                        "or YAML file. Default: dsv4_tiny_cpu."),
    target: Optional[str] = typer.Option(None, "--target", help="builtin (dsv4 decode step in a worker) "
                                         "or replay:TABLE. Default: the space file's target."),
    preset: Optional[str] = typer.Option(None, "--preset", help="Model preset (tiny, flash-slice, "
                                         "pro-slice). Default: the space file's."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu | cuda | auto. Default: the space file's."),
    budget: Optional[str] = typer.Option(None, "--budget", "-b", help="Wall time, restarts included: "
                                         "90s, 2m, 2h, 1h30m. Default: 2h."),
    max_trials: Optional[int] = typer.Option(None, "--max-trials", "-n", help="At most N trials in this "
                                             "run (baseline and re-runs included; the final "
                                             "confirmation of the best is extra)."),
    study: Optional[str] = typer.Option(None, "--study", help="Study name. Default: the space's name. "
                                        "An existing study is continued."),
    db: Optional[str] = typer.Option(None, "--db", help="Database URL or SQLite path. Default: "
                                     "$AUTOOPT_DB, else db/autoopt.sqlite."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the strategy's sampler (recorded)."),
    resume: bool = typer.Option(False, "--resume", help="Continue --study (default: the most recently "
                                "active study) with the settings its last run recorded."),
    strategy: Optional[str] = typer.Option(None, "--strategy", help="tpe | random | gp, or agent / grid "
                                           "when autoopt.agent registers them. Default: agent when "
                                           "installed, else tpe."),
    min_gain: Optional[str] = typer.Option(None, "--min-gain", help="The agent's stop rule, GAIN%/TIME: "
                                           "it stops by itself when no candidate is expected to win "
                                           "at least GAIN per TIME of restart + measurement (e.g. "
                                           "1%/10min, 0.5%/5m, 2%/h; 0 = never stop for lack of "
                                           "gain). Default: 1%/10min."),
    objective: Optional[str] = typer.Option(None, "--objective", help="Replay target: the table's "
                                            "objective column (default: the side-car YAML's, else "
                                            "tok_per_s / time)."),
    minimize: Optional[bool] = typer.Option(None, "--minimize/--maximize", help="Replay target: the "
                                            "objective's direction (default: the side-car YAML's)."),
    measure_s: Optional[float] = typer.Option(None, "--measure-s", help="Replay target: simulated "
                                              "seconds of one measurement for rows without measure_s."),
    restart_s: list[str] = typer.Option([], "--restart-s", help="Replay target: KNOB=SECONDS, the "
                                        "simulated cost of switching KNOB (repeatable; wins over the "
                                        "side-car YAML)."),
    confirm: bool = typer.Option(True, "--confirm/--no-confirm", help="Re-measure the best at the end "
                                 "(a budget reserve is kept for it)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout (progress goes "
                                 "to stderr)."),
    live: Optional[bool] = typer.Option(None, "--live/--plain", help="Rich live panel or plain log "
                                        "lines. Default: live on a terminal."),
) -> None:
    """Search the space: baseline first, then the strategy's proposals until the budget, --max-trials
    or the strategy says stop; re-measure the best; print it with its CI and speed-up.

    Examples:

      autoopt run --budget 2m

      autoopt run --space dsv4_flash_decode --budget 2h --study flash-h200

      autoopt run --budget 30m --min-gain 0.5%/5m

      autoopt run --resume

      autoopt run --target replay:benchmarks/data/tiny_cpu_grid.csv --budget 30m --restart-s attention=45
    """
    from autoopt.live_view import LiveView
    from autoopt.run_session import RunOptions, execute, parse_restart_s, summary

    opts = RunOptions(space=space, target=target, preset=preset, device=device, budget=budget,
                      max_trials=max_trials, study=study, db=db, seed=seed, resume=resume,
                      strategy=strategy, confirm=confirm, min_gain=min_gain,
                      replay={"objective": objective, "minimize": minimize, "measure_s": measure_s,
                              "restart_s": parse_restart_s(restart_s)},
                      command_line=shlex.join(["autoopt", *sys.argv[1:]]))
    observer = LiveView(live=False if as_json else live)
    try:
        result = execute(opts, observer=observer)
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C); run the same command again to continue", file=sys.stderr)
        raise typer.Exit(130)
    if as_json:
        print(json.dumps(summary(result), indent=2, default=str))
    else:
        _print_result(result)
    raise typer.Exit(result.exit_code)


def _print_result(result: Any) -> None:
    from rich.console import Console

    from autoopt.budget import format_duration
    from autoopt.live_view import objective_text, speedup_text, status_text

    out = Console(highlight=False, soft_wrap=True)
    n_ok = sum(1 for t in result.trials if t.objective is not None)
    out.print(f"study [bold]{result.study_name}[/bold] (run {result.run_id}): {len(result.trials)} "
              f"trials in {format_duration(result.elapsed_s)} ({n_ok} ok, "
              f"{len(result.trials) - n_ok} failed or wrong)")
    out.print(f"stopped: {result.stop_reason}")
    base, best, conf = result.baseline, result.best, result.confirmation
    if base is not None:
        out.print(f"baseline #{base.number}: {objective_text(base)}")
    if best is not None:
        changed = {k: v for k, v in best.params.items() if base is None or base.params.get(k) != v}
        if base is not None and best is base:
            out.print(f"best: the baseline #{base.number} (no trial beats it outside the noise: a trial "
                      "counts when its 95% CI low end is above the baseline's CI high end)")
        else:
            confirms = best.decision.extra.get("confirms") if best.decision is not None else None
            of = f" (the confirmation of #{confirms})" if confirms is not None else ""
            out.print(f"[green]best #{best.number}{of}: {objective_text(best)} {speedup_text(best, base)}[/green]")
            out.print("  " + (", ".join(f"{k}={v}" for k, v in changed.items()) or "the baseline's configuration"))
    else:
        out.print("[red]no successful trial[/red]")
        for t in result.trials[-3:]:
            out.print(f"  #{t.number}: {status_text(t)}")
    if conf is not None:
        of = conf.decision.extra.get("confirms") if conf.decision is not None else None
        orig = next((t for t in result.history if t.number == of), None)
        out.print(f"confirmation #{conf.number}" + (f" of #{of}" if of is not None else "")
                  + f": {objective_text(conf)} {speedup_text(conf, base)} ({status_text(conf)})")
        if orig is not None and orig.objective_ci and conf.objective_ci and (
                conf.objective_ci[1] < orig.objective_ci[0] or conf.objective_ci[0] > orig.objective_ci[1]):
            out.print(f"[yellow]the confirmation disagrees with trial #{orig.number} (the CIs do not "
                      "overlap): the machine changed or the first figure was luck; measure again before "
                      "trusting this win[/yellow]")
    if result.exit_code == 130:
        out.print("interrupted: run the same command again (or `autoopt run --resume`) to continue")
