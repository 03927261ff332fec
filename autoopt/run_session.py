"""One `autoopt run`, assembled: store, target, space, strategy, budget, loop (the CLI only parses).

    result = execute(RunOptions(space="dsv4_tiny_cpu", budget="2m"), observer=LiveView())

Study names: `--study`, else the space's name (plus `-<preset>` when --preset overrides the file's).
Running again on an existing study continues it (interrupted trials are re-run first). `--resume`
continues the given study (or the most recently active one) with the settings recorded by its last
run — space file, target, preset, device, strategy — unless given again on the command line.
"""
from __future__ import annotations

import random
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoopt.budget import Budget, parse_duration
from autoopt.errors import UserError
from autoopt.loop import LoopSettings, RunResult, SearchLoop

DEFAULT_SPACE = "dsv4_tiny_cpu"
DEFAULT_BUDGET = "2h"
MIN_GAIN_STRATEGIES = ("agent",)  # strategies whose factory takes min_gain= (their own stop rule)


@dataclass
class RunOptions:
    space: str | None = None
    target: str | None = None  # builtin | replay:TABLE (default: the space file's `target`)
    preset: str | None = None
    device: str | None = None
    budget: str | None = None
    max_trials: int | None = None
    study: str | None = None
    db: str | None = None
    seed: int | None = None
    resume: bool = False
    strategy: str | None = None
    confirm: bool = True
    min_gain: str | None = None  # the agent's stop rule, GAIN%/TIME (default autoopt.agent.stop)
    command_line: str | None = None
    replay: dict[str, Any] | None = None  # replay-target options: objective, minimize, measure_s, restart_s


def parse_min_gain(text: str | None) -> str:
    """The --min-gain text, checked (UserError naming the expected form), default filled in."""
    from autoopt.agent.stop import MinGain

    return MinGain.parse(text).text


def parse_restart_s(items: list[str] | None) -> dict[str, float]:
    """`--restart-s KNOB=SECONDS` (repeatable) -> {knob: seconds}; UserError on bad syntax."""
    out: dict[str, float] = {}
    for item in items or ():
        knob, sep, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not sep or not knob.strip() or seconds < 0:
            raise UserError(f"--restart-s {item!r}: expected KNOB=SECONDS with SECONDS >= 0 (e.g. "
                            "attention=45)")
        out[knob.strip()] = seconds
    return out


def open_target(spec: str, preset: str, device: str, shape: dict[str, Any] | None = None,
                seed: int | None = None, replay: dict[str, Any] | None = None) -> Any:
    """A Target from its spec: `builtin` (dsv4 in a worker process) or `replay:TABLE`; `replay` holds
    the replay-only options (objective, minimize, measure_s, restart_s)."""
    replay = {k: v for k, v in (replay or {}).items() if v not in (None, {}, [])}
    if replay and not spec.startswith("replay:"):
        raise UserError(f"--objective/--minimize/--maximize/--measure-s/--restart-s apply to a replay "
                        f"target (--target replay:TABLE), not to {spec!r}")
    if spec == "builtin":
        from autoopt.targets.builtin import BuiltinTarget

        return BuiltinTarget(preset=preset, device=device, shape=shape or {})
    if spec.startswith("replay:"):
        from autoopt.targets.replay import from_spec

        try:
            return from_spec(spec, seed=seed or 0, **replay)
        except (OSError, ValueError) as exc:
            raise UserError(f"--target {spec}: {exc}") from None
    raise UserError(f"--target: unknown target {spec!r} (expected builtin or replay:TABLE)")


def _resume_defaults(store: Any, opts: RunOptions) -> RunOptions:
    """Fill what the command line left out from the study's last run (for --resume)."""
    study = store.resolve_study(opts.study)  # UserError naming the known studies
    runs = store.runs(study)
    if not runs:
        raise UserError(f"--resume: study {study!r} has no recorded run to take settings from")
    last = runs[-1].settings or {}
    filled = RunOptions(**vars(opts))
    filled.study = study
    filled.space = opts.space or last.get("space_path") or runs[-1].space_name
    if filled.space and not opts.space and str(last.get("target_spec", "")).startswith("replay:") \
            and not Path(filled.space).exists():
        filled.space = None  # the replay table's own space: rebuilt from the table
    filled.target = opts.target or last.get("target_spec")
    filled.preset = opts.preset or runs[-1].preset
    filled.device = opts.device or last.get("device")
    filled.strategy = opts.strategy or last.get("strategy")
    filled.min_gain = opts.min_gain or last.get("min_gain")
    if opts.seed is None and runs[-1].seed is not None:
        filled.seed = int(runs[-1].seed) + len(runs)  # same stream family, not the same proposals
    return filled


def execute(opts: RunOptions, observer: Any = None) -> RunResult:
    """Run the search; returns the RunResult (its exit_code is the process's). UserError (exit 2) for
    bad input or infrastructure; KeyboardInterrupt outside the loop propagates (exit 130)."""
    from autoopt import strategies
    from autoopt.space import SearchSpace, TargetInfo
    from autoopt.space_doc import SpaceDocument
    from autoopt.store import Store

    budget_s = parse_duration(opts.budget or DEFAULT_BUDGET)
    if opts.max_trials is not None and opts.max_trials < 1:
        raise UserError(f"--max-trials: expected a positive number, got {opts.max_trials}")
    if opts.device is not None and opts.device not in ("cpu", "cuda", "auto"):
        raise UserError(f"--device: expected cpu, cuda or auto, got {opts.device!r}")
    if opts.strategy is not None and opts.strategy not in strategies.names():
        raise UserError(f"--strategy: unknown strategy {opts.strategy!r} "
                        f"(expected one of: {', '.join(strategies.names())})")
    parse_min_gain(opts.min_gain)  # bad syntax: exit 2 before anything is opened
    store = Store.open(opts.db)
    target = None
    try:
        if opts.resume:
            opts = _resume_defaults(store, opts)
        min_gain = parse_min_gain(opts.min_gain)  # given, else the resumed run's, else the default
        seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(2 ** 31)
        if opts.space is None and (opts.target or "").startswith("replay:"):
            # a replay table alone: every column a global knob (autoopt.targets.replay.replay_space)
            from autoopt.targets.replay import replay_space

            target_spec, preset, device = opts.target, opts.preset or "replay", "none"
            target = open_target(target_spec, preset, device, {}, seed, opts.replay)
            budget = Budget(budget_s, clock=target.now)
            budget.start()
            space = replay_space(target)
        else:
            doc = SpaceDocument.read(opts.space or DEFAULT_SPACE)
            preset = opts.preset or str(doc.header("preset", "tiny"))
            device = opts.device or str(doc.header("device", "auto"))
            target_spec = opts.target or str(doc.header("target", "builtin"))
            target = open_target(target_spec, preset, device, doc.header("shape_overrides") or {}, seed,
                                 opts.replay)
            budget = Budget(budget_s, clock=target.now)
            budget.start()  # the budget includes starting the target (its first worker)
            space = SearchSpace(doc, TargetInfo.from_target(target))
        study = opts.study or space.name + (f"-{preset}" if opts.preset and opts.preset != space.preset else "")
        strategy_name = opts.strategy or strategies.default_name()
        options: dict[str, Any] = {}
        if strategy_name in MIN_GAIN_STRATEGIES:
            options["min_gain"] = min_gain
        elif opts.min_gain is not None and observer is not None:
            observer.note(f"note: --min-gain is the agent's stop rule; strategy {strategy_name!r} ignores it")
        strategy = strategies.get(strategy_name, space, seed, **options)
        previous = store.runs(study) if study in store.studies() else []
        if previous and previous[-1].space_sha256 not in (None, space.sha256) and observer is not None:
            observer.note(f"note: {space.doc.display_path} changed since study {study!r} was last run; "
                          "trials that no longer fit the space are ignored by the strategy")
        run_id = store.start_run(
            study_name=study, command_line=opts.command_line or shlex.join(sys.argv),
            space_name=space.name, space_sha256=space.sha256, target=target_spec, preset=preset,
            seed=seed, settings=_settings(space, opts, budget_s, strategy_name, target_spec, device,
                                          min_gain if strategy_name in MIN_GAIN_STRATEGIES else None))
        settings = LoopSettings(study_name=study, max_trials=opts.max_trials, confirm=opts.confirm)
        loop = SearchLoop(store, target, space, strategy, budget, settings, observer, run_id=run_id)
        try:
            return loop.run()
        except BaseException as exc:
            if not isinstance(exc, KeyboardInterrupt):
                _finish_failed(store, run_id, exc)
            raise
    finally:
        if target is not None:
            target.close()
        if observer is not None:
            observer.close()
        store.close()


def _settings(space: Any, opts: RunOptions, budget_s: float, strategy: str, target_spec: str,
              device: str, min_gain: str | None = None) -> dict[str, Any]:
    weights = space.objective.weights
    out: dict[str, Any] = {
        "space_path": str(space.path.resolve()), "target_spec": target_spec, "device": device,
        "strategy": strategy, "min_gain": min_gain, "budget_s": budget_s, "max_trials": opts.max_trials,
        "confirm": opts.confirm, "concurrency": list(space.concurrency),
        "measurement": space.measurement, "objective_text": space.objective.describe(),
        "params": [p.name for p in space.params],
    }
    if len(weights) == 1:
        out["objective"] = f"tok_per_s@{next(iter(weights))}"
    else:  # a weighted mix: the store's read-side figure defaults to its heaviest concurrency
        out["objective_mix"] = {str(c): w for c, w in weights.items()}
        out["objective_concurrency"] = max(weights, key=weights.get)
    return out


def _finish_failed(store: Any, run_id: int, exc: BaseException) -> None:
    try:
        store.finish_run(run_id, "failed", f"{type(exc).__name__}: {exc}".splitlines()[0][:500])
    except Exception as inner:  # the store itself may be what failed; the original error matters more
        print(f"warning: could not mark run {run_id} failed: {inner}", file=sys.stderr)


def summary(result: RunResult) -> dict[str, Any]:
    """JSON summary of a run (`autoopt run --json`)."""
    def trial(t: Any) -> dict[str, Any] | None:
        if t is None:
            return None
        base = result.baseline
        return {"number": t.number, "source": t.decision.source if t.decision else None,
                "status": t.measurement.status, "objective": t.objective,
                "objective_ci": list(t.objective_ci) if t.objective_ci else None,
                "speedup": (t.objective / base.objective) if (t.objective and base and base.objective) else None,
                "params": t.params, "cost_s": t.cost_s,
                "failure": (f"{t.measurement.failure.kind}: {t.measurement.failure.reason}"
                            if t.measurement.failure else None)}
    return {
        "run_id": result.run_id, "study": result.study_name, "state": result.state,
        "stop_reason": result.stop_reason, "exit_code": result.exit_code,
        "elapsed_s": result.elapsed_s, "trials_this_run": len(result.trials),
        "trials_in_study": len(result.history) + sum(1 for t in result.trials if t.decision is not None
                                                     and t.decision.source == "confirm"),
        "baseline": trial(result.baseline),
        "best": trial(result.best), "confirmation": trial(result.confirmation),
        "trials": [trial(t) for t in result.trials],
    }
