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

from autoopt.errors import UserError
from autoopt.search.budget import Budget
from autoopt.search import compile_cache, incumbent, warm_start
from autoopt.search.loop import LoopSettings, RunResult, SearchLoop
from autoopt.search.run_types import transition_seconds
from autoopt.search.warm_start import WarmStart, WarmStartedStrategy
from autoopt.store.analysis import Mix
from autoopt.trial import DecisionSource
from autoopt.units import parse_duration

DEFAULT_SPACE = "dsv4_tiny_cpu"  # without a GPU
DEFAULT_GPU_SPACE = "dsv4_flash_decode"  # where an NVIDIA GPU is visible
DEFAULT_BUDGET = "2h"
MAX_SEED = 2 ** 31 - 1  # numpy's samplers take < 2**32; the runs table's seed column is a 32-bit int
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
    min_gain: str | None = None  # the agent's stop rule, GAIN%/TIME (default autoopt.search.agent.stop)
    command_line: str | None = None
    replay: dict[str, Any] | None = None  # replay-target options: objective, minimize, measure_s, restart_s
    measure_lock: bool = True  # runs on this host take turns measuring (autoopt.store.locks)
    replay_pace_s: float | None = None  # replay target: real seconds each evaluation also waits
    warm_start: str | None = None  # another study whose trials the agent starts from (autoopt.search.warm_start)
    warm_start_db: str | None = None  # ... in this database (None: the run's own)


def parse_min_gain(text: str | None) -> str:
    """The --min-gain text, checked (UserError naming the expected form), default filled in."""
    from autoopt.search.agent.stop import MinGain

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
                seed: int | None = None, replay: dict[str, Any] | None = None,
                compile_cache: Path | None = None) -> Any:
    """A Target from its spec: `builtin` (dsv4 in a worker process) or `replay:TABLE`; `replay` holds
    the replay-only options (objective, minimize, measure_s, restart_s); `compile_cache` the builtin
    workers' Inductor / Triton cache directory (autoopt.search.compile_cache)."""
    replay = {k: v for k, v in (replay or {}).items() if v not in (None, {}, [])}
    if replay and not spec.startswith("replay:"):
        raise UserError(f"--objective/--minimize/--maximize/--measure-s/--restart-s apply to a replay "
                        f"target (--target replay:TABLE), not to {spec!r}")
    if spec == "builtin":
        from autoopt.targets.builtin.client import with_compile_cache
        from autoopt.targets.builtin.target import BuiltinTarget

        env = with_compile_cache(None, compile_cache) if compile_cache is not None else None
        return BuiltinTarget(preset=preset, device=device, shape=shape or {}, worker_env=env)
    if spec.startswith("replay:"):
        from autoopt.targets.replay.target import from_spec

        try:
            return from_spec(spec, seed=seed or 0, **replay)
        except (OSError, ValueError) as exc:
            raise UserError(f"--target {spec}: {exc}") from None
    if spec.startswith("server:"):
        from autoopt.targets.server.target import from_spec as server_from_spec

        return server_from_spec(spec)[0]
    raise UserError(f"--target: unknown target {spec!r} (expected builtin, replay:TABLE or server:FILE.yaml)")


class PacedTarget:
    """A replay target whose every evaluation also takes `pace_s` real seconds (`--replay-pace-s`):
    to rehearse runs side by side (their turns, claims and shared baseline) at a human pace, while
    the budget still runs on the table's simulated clock. Everything else is the replay target's."""

    def __init__(self, inner: Any, pace_s: float) -> None:
        self._inner, self.pace_s = inner, pace_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def evaluate(self, request: Any) -> Any:
        import time

        time.sleep(self.pace_s)
        return self._inner.evaluate(request)


def _paced(target: Any, pace_s: float | None) -> Any:
    if pace_s is None:
        return target
    if getattr(target, "name", "") != "replay":
        target.close()
        raise UserError("--replay-pace-s applies to a replay target (--target replay:TABLE)")
    return PacedTarget(target, pace_s)


def _resume_defaults(store: Any, opts: RunOptions) -> RunOptions:
    """Fill what the command line left out from the study's last run (for --resume)."""
    from autoopt.search import registry as strategies

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
    warm = last.get("warm_start") or {}  # repeated for the agent (another --strategy given now leaves it)
    if opts.warm_start is None and warm.get("study") and \
            (filled.strategy or strategies.default_name()) in warm_start.STRATEGIES:
        filled.warm_start, filled.warm_start_db = warm["study"], opts.warm_start_db or warm.get("db")
    if opts.seed is None and runs[-1].seed is not None:
        filled.seed = int(runs[-1].seed) + len(runs)  # same stream family, not the same proposals
    return filled


@dataclass
class _Opened:
    """What a run works on: the target (started), its space and the budget (already running)."""

    target: Any
    space: Any
    budget: Budget
    target_spec: str
    preset: str
    device: str
    compile_cache: Path | None = None  # the builtin workers' Inductor / Triton caches


def _check_options(opts: RunOptions) -> float:
    """Bad input fails here, before anything is opened (exit 2); returns the budget in seconds."""
    from autoopt.search import registry as strategies

    budget_s = parse_duration(opts.budget or DEFAULT_BUDGET)
    if opts.max_trials is not None and opts.max_trials < 1:
        raise UserError(f"--max-trials: expected a positive number, got {opts.max_trials}")
    if opts.seed is not None and not 0 <= opts.seed <= MAX_SEED:
        raise UserError(f"--seed: expected an integer from 0 to {MAX_SEED} (2**31 - 1: the samplers' "
                        f"and the database's range), got {opts.seed}")
    if opts.device is not None and opts.device not in ("cpu", "cuda", "auto"):
        raise UserError(f"--device: expected cpu, cuda or auto, got {opts.device!r}")
    if opts.strategy is not None and opts.strategy not in strategies.names():
        raise UserError(f"--strategy: unknown strategy {opts.strategy!r} "
                        f"(expected one of: {', '.join(strategies.names())})")
    if opts.replay_pace_s is not None and not 0 < opts.replay_pace_s <= 600:
        raise UserError(f"--replay-pace-s: expected seconds in (0, 600], got {opts.replay_pace_s:g}")
    parse_min_gain(opts.min_gain)
    if opts.warm_start_db is not None and opts.warm_start is None:
        raise UserError(f"--warm-start-db {opts.warm_start_db}: applies with --warm-start STUDY")
    return budget_s


def default_space() -> tuple[str, str]:
    """The space a run tunes when none is named: the flash-slice decode step on a GPU, the tiny CPU
    space otherwise, and the line saying which and why (found without importing torch)."""
    from autoopt.targets.builtin.devices import guess_device

    guess = guess_device()
    name = DEFAULT_GPU_SPACE if guess.device == "cuda" else DEFAULT_SPACE
    return name, (f"space: {name} (the default {'on a GPU' if guess.device == 'cuda' else 'without a GPU'}: "
                  f"{guess.how}; --space picks another)")


def study_name(opts: RunOptions, space_name: str, space_preset: str, preset: str) -> str:
    """--study, else the space's name (plus -<preset> when --preset overrides the file's)."""
    return opts.study or space_name + (f"-{preset}" if opts.preset and opts.preset != space_preset else "")


def _open(opts: RunOptions, budget_s: float, seed: int, observer: Any = None, store_url: str = "") -> _Opened:
    """Start the target and build the space; the budget includes starting the target."""
    from autoopt.space.document import SpaceDocument
    from autoopt.space.space import SearchSpace, TargetInfo

    if opts.space is None and (opts.target or "").startswith("replay:"):
        # a replay table alone: every column a global knob (autoopt.targets.replay.target.replay_space)
        from autoopt.targets.replay.target import replay_space

        spec, preset, device = opts.target, opts.preset or "replay", "none"
        target = _paced(open_target(spec, preset, device, {}, seed, opts.replay), opts.replay_pace_s)
        return _opened_with(target, lambda: replay_space(target), budget_s, spec, preset, device)
    from autoopt.search import server_open

    named = opts.space or server_open.space_of(opts.target)
    default, why_default = default_space() if named is None else (None, None)
    doc = SpaceDocument.read(named or default)
    preset = opts.preset or str(doc.header("preset", "tiny"))
    device = opts.device or str(doc.header("device", "auto"))
    spec = opts.target or str(doc.header("target", "builtin"))
    if server_open.is_server(spec):  # a server space: the target is the file's server: block
        target, make_space, spec = server_open.open_server(spec, doc, opts.db, opts.study)
        return _opened_with(target, make_space, budget_s, spec, "server", device)
    study = study_name(opts, str(doc.header("name") or doc.path.stem), str(doc.header("preset", "tiny")), preset)
    cache = compile_cache.directory(store_url, study) if spec == "builtin" else None
    target = _paced(open_target(spec, preset, device, doc.header("shape_overrides") or {}, seed, opts.replay,
                                cache), opts.replay_pace_s)
    opened = _opened_with(target, lambda: SearchSpace(doc, TargetInfo.from_target(target)), budget_s, spec,
                          preset, device)
    opened.compile_cache = cache
    if why_default and observer is not None:  # said once the input is known good (errors stay one line)
        observer.note(why_default)
    return opened


def _opened_with(target: Any, make_space: Any, budget_s: float, spec: str, preset: str,
                 device: str) -> _Opened:
    """The budget starts with the target (its first worker counts); a space that cannot be built
    closes the target again (no worker outlives the run)."""
    budget = Budget(budget_s, clock=target.now)
    budget.start()
    try:
        return _Opened(target, make_space(), budget, spec, preset, device)
    except BaseException:
        target.close()
        raise


def _strategy(opts: RunOptions, space: Any, seed: int, min_gain: str, observer: Any,
              warm: WarmStart | None = None) -> tuple[str, Any]:
    from autoopt.search import registry as strategies

    name = opts.strategy or strategies.default_name()
    options: dict[str, Any] = {}
    if name in MIN_GAIN_STRATEGIES:
        options["min_gain"] = min_gain
    elif opts.min_gain is not None and observer is not None:
        observer.note(f"note: --min-gain is the agent's stop rule; strategy {name!r} ignores it")
    if warm is None:
        return name, strategies.get(name, space, seed, **options)
    agent = strategies.get(name, space, seed, warm_start=warm.trials, warm_start_source=warm.label, **options)
    return name, WarmStartedStrategy(agent, warm, observer)


def execute(opts: RunOptions, observer: Any = None) -> RunResult:
    """Run the search; returns the RunResult (its exit_code is the process's). UserError (exit 2) for
    bad input or infrastructure; KeyboardInterrupt outside the loop propagates (exit 130)."""
    from autoopt.store import Store

    budget_s = _check_options(opts)
    store = Store.open(opts.db)
    opened = None
    try:
        if opts.resume:
            opts = _resume_defaults(store, opts)
        min_gain = parse_min_gain(opts.min_gain)  # given, else the resumed run's, else the default
        warm_start.check_strategy(opts.warm_start, opts.strategy)
        warm = warm_start.read(opts.warm_start, opts.warm_start_db, store) if opts.warm_start else None
        seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(2 ** 31)
        opened = _open(opts, budget_s, seed, observer, store.url)
        space = opened.space
        study = study_name(opts, space.name, space.preset, opened.preset)
        if warm is not None:
            warm_start.fit(warm, space, study)
        strategy_name, strategy = _strategy(opts, space, seed, min_gain, observer, warm)
        previous = store.runs(study) if study in store.studies() else []
        if previous and previous[-1].space_sha256 not in (None, space.sha256) and observer is not None:
            observer.note(f"note: {space.doc.display_path} changed since study {study!r} was last run; "
                          "trials that no longer fit the space are ignored by the strategy")
        run_id = store.start_run(
            study_name=study, command_line=opts.command_line or shlex.join(sys.argv),
            space_name=space.name, space_sha256=space.sha256, target=opened.target_spec,
            preset=opened.preset, seed=seed,
            settings=_settings(space, opts, budget_s, strategy_name, opened.target_spec, opened.device,
                               min_gain if strategy_name in MIN_GAIN_STRATEGIES else None, warm,
                               opened.compile_cache))
        settings = LoopSettings(study_name=study, max_trials=opts.max_trials, confirm=opts.confirm,
                                measure_lock=opts.measure_lock)
        loop = SearchLoop(store, opened.target, space, strategy, opened.budget, settings, observer,
                          run_id=run_id)
        try:
            result = loop.run()
            result.warm_start = warm.to_json() if warm is not None else None
            return result
        except BaseException as exc:
            if not isinstance(exc, KeyboardInterrupt):
                _finish_failed(store, run_id, exc)
            raise
    finally:
        if opened is not None:
            opened.target.close()
        if observer is not None:
            observer.close()
        store.close()


def _settings(space: Any, opts: RunOptions, budget_s: float, strategy: str, target_spec: str,
              device: str, min_gain: str | None = None, warm: WarmStart | None = None,
              cache_dir: Path | None = None) -> dict[str, Any]:
    weights = space.objective.weights
    out: dict[str, Any] = {
        "space_path": str(space.path.resolve()), "target_spec": target_spec, "device": device,
        "strategy": strategy, "min_gain": min_gain, "budget_s": budget_s, "max_trials": opts.max_trials,
        "confirm": opts.confirm, "concurrency": list(space.concurrency),
        "measurement": space.measurement, "objective_text": space.objective.describe(),
        "params": [p.name for p in space.params],
        "warm_start": warm.to_json() if warm is not None else None,
        "compile_cache": str(cache_dir) if cache_dir is not None else None,
    }
    key = incumbent.objective_key(space)  # what the run ranks by, and `autoopt best` reads back
    if isinstance(key, Mix):  # objective_concurrency: its heaviest C, for readers of older records
        out["objective_mix"] = key.to_json()
        out["objective_concurrency"] = max(weights, key=weights.get)
    else:
        out["objective"] = f"tok_per_s@{key}"
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
                "params": t.params, "cost_s": t.cost_s, "transition_s": _transition(t),
                "failure": (f"{t.measurement.failure.kind}: {t.measurement.failure.reason}"
                            if t.measurement.failure else None)}
    accuracy, calibration = result.transition_accuracy(), result.gain_calibration()
    return {
        "run_id": result.run_id, "study": result.study_name, "state": result.state,
        "stop_reason": result.stop_reason, "exit_code": result.exit_code,
        "elapsed_s": result.elapsed_s, "trials_this_run": len(result.trials),
        "trials_in_study": len(result.history) + sum(1 for t in result.trials if t.decision is not None
                                                     and t.decision.kind is DecisionSource.CONFIRM),
        "warm_start": result.warm_start, "transitions": accuracy.to_json() if accuracy is not None else None,
        "calibration": calibration.to_json() if calibration is not None else None,
        "baseline": trial(result.baseline),
        "best": trial(result.best), "confirmation": trial(result.confirmation),
        "trials": [trial(t) for t in result.trials],
    }


def _transition(t: Any) -> dict[str, float] | None:
    pair = transition_seconds(t)
    return {"predicted": pair[0], "actual": pair[1]} if pair is not None else None
