"""`autoopt record`: a trial measured outside autoopt, stored, diagnosed and weighed.

The case study's cycle — edit the engine, restart it, sweep tok/s with a load generator, profile —
run by a person or another agent, recorded one trial at a time:

  1. the result files (autoopt.targets.server.results: `vllm bench serve --save-result`, SGLang
     bench_serving JSON lines, AIPerf's profile_export_aiperf.json, autoopt bench-serve) become the
     trial's Measurement: tok/s per C from the space's objective metric (output tok/s unless a server
     space names another), the serving figures, the trace's buckets (autoopt.profile.trace), the costs
     (restart = --restart-s, measure = the runs' own seconds);
  2. it is stored as a trial of the study (decision source "recorded", the label its reason; the
     study's first trial is its baseline), in a run of its own whose settings name the space file, so
     the reading commands (history, show, diff, best) and `autoopt suggest` work on the study;
  3. it is diagnosed against its parent (--parent, else the study's latest successful trial) by the
     agent's diagnosis (autoopt.search.agent.diagnosis: the bucket diff of autoopt.profile.diff when
     both have traces: "... casts ate 49% of the GEMM gain");
  4. the stop rule's advice: the agent's next candidate, its expected gain and its cost from the one
     cost model, weighed against --min-gain (autoopt.search.suggest).
Every input is checked before anything is written (UserError, exit 2).
"""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

from autoopt.errors import UserError


@dataclass
class RecordOptions:
    study: str
    label: str
    bench: list[str]
    sets: list[str] = field(default_factory=list)
    trace: str | None = None
    restart_s: float = 0.0
    measure_s: float | None = None  # default: the seconds the result files report
    parent: int | None = None
    space: str | None = None  # required for a new study; remembered afterwards
    concurrency: int | None = None  # for result files that do not say theirs
    min_gain: str | None = None
    budget_left: str | None = None
    db: str | None = None
    command_line: str | None = None


def parse_sets(items: list[str], space: Any) -> dict[str, Any]:
    """`KNOB=VALUE` (repeatable; VALUE read as YAML: true, 16, bf16) over the space's baseline."""
    params = space.baseline_params()
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UserError(f"--set {item!r}: expected KNOB=VALUE (e.g. --set mhc_gemm=bf16)")
        p = space.param_by_name.get(name)
        if p is None:
            raise UserError(f"--set {item!r}: {name!r} is not a parameter of space {space.name!r} "
                            f"(expected one of: {', '.join(space.param_by_name)})")
        try:
            value = yaml.safe_load(text) if text.strip() else text
        except yaml.YAMLError:
            value = text
        match = [c for c in p.choices if c == value and type(c) is type(value)] or \
            [c for c in p.choices if str(c) == text.strip()]
        if not match:
            raise UserError(f"--set {item!r}: {text!r} is not one of {name}'s values "
                            f"{list(p.choices)} in {space.doc.display_path}")
        params[name] = match[0]
    if not space.is_feasible(params):
        raise UserError(f"--set {' '.join(items)}: the configuration breaks a constraint of "
                        f"{space.doc.display_path}")
    return params


def objective_metric(space: Any) -> str:
    """output_throughput, or the server space's server.objective_metric."""
    if space.target_name == "server":
        from autoopt.targets.server import spec as server_spec

        return server_spec.read(space.doc.path).objective_metric
    return "output_throughput"


def measurement(opts: RecordOptions, space: Any) -> Any:
    """The recorded trial's Measurement (the result files read, the trace bucketed)."""
    from autoopt.measurement import Measurement
    from autoopt.targets.server.results import read_results, serving_field

    res = read_results(list(opts.bench), opts.concurrency)
    metric = objective_metric(space)
    tok = res.throughput(metric)
    missing = sorted(set(space.objective.weights) - {int(c) for c in tok})
    if missing:
        raise UserError(f"--bench {' '.join(opts.bench)}: no {metric} at C={missing} (measured: "
                        f"C={sorted(int(c) for c in tok) or 'none'}), which the objective of "
                        f"{space.doc.display_path} needs")
    measure_s = opts.measure_s if opts.measure_s is not None else (res.duration_s or 0.0)
    what_ran = {"recorded": opts.label, "bench_result": " ".join(res.paths), "load_generator": res.source,
                "objective": metric, "restart": f"{opts.restart_s:g} s as given (--restart-s)"}
    extra: dict[str, Any] = {}
    if opts.trace:
        from autoopt.profile.trace import profile_trace

        prof = profile_trace(opts.trace)
        extra = prof.measurement_fields()
        what_ran["profile"] = f"{opts.trace} ({prof.source} trace, {prof.kernel_count} events)"
    costs = {"restart": float(opts.restart_s), "measure": float(measure_s), "total": opts.restart_s + measure_s}
    return Measurement(status="ok", config={}, tok_per_s=tok, costs_s=costs, what_ran=what_ran,
                       environment={"recorded": True, "load_generator": res.source, "model": res.model,
                                    "notes": list(res.notes)},
                       correctness={"verdict": "ok", "source": "not checked: measured outside autoopt"},
                       serving=serving_field(res), **extra)


def record(opts: RecordOptions) -> dict[str, Any]:
    """Store the trial; returns {study, trial, objective, diagnosis, advice}."""
    from autoopt.search.suggest import study_space, suggest
    from autoopt.store import Store
    from autoopt.units import parse_duration

    if opts.restart_s < 0 or (opts.measure_s is not None and opts.measure_s < 0):
        raise UserError("--restart-s / --measure-s: expected seconds >= 0")
    budget_left_s = parse_duration(opts.budget_left) if opts.budget_left else None
    with Store.open(opts.db) as store:
        space = study_space(store, opts.study, opts.space)
        params = parse_sets(opts.sets, space)
        m = measurement(opts, space)
        m.config = space.params_to_config(params)
        outcomes = _finished(store, opts.study)
        parent = _parent(opts, outcomes)
        number, diag = _store(store, opts, space, params, m, parent)
        advice = suggest(store, opts.study, space, opts.min_gain, budget_left_s)
        trial = store.trial(opts.study, number)
    return {"study": opts.study, "trial": number, "baseline": trial.is_baseline,
            "objective": trial.result.objective, "speedup": trial.result.speedup,
            "parent": parent.number if parent is not None else None,
            "diagnosis": diag.verdict if diag is not None else None, "advice": advice.to_json()}


def _finished(store: Any, study: str) -> list[Any]:
    from autoopt.search.suggest import history

    return history(store, study) if study in store.studies() else []


def _parent(opts: RecordOptions, outcomes: list[Any]) -> Any:
    if opts.parent is None:
        return next((t for t in reversed(outcomes) if t.result.ok), None)
    found = next((t for t in outcomes if t.number == opts.parent), None)
    if found is None or not found.result.ok:
        raise UserError(f"--parent {opts.parent}: study {opts.study!r} has no successful trial "
                        f"{opts.parent} (successful: {[t.number for t in outcomes if t.result.ok]})")
    return found


def _store(store: Any, opts: RecordOptions, space: Any, params: dict[str, Any], m: Any,
           parent: Any) -> tuple[int, Any]:
    """One run holding one trial; returns (trial number, its diagnosis)."""
    from autoopt.search.agent.diagnosis import diagnose_trial
    from autoopt.search.session import RunOptions, _settings
    from autoopt.search.strategy import TrialOutcome
    from autoopt.trial import Decision, DecisionSource

    base = store.baseline(opts.study) if opts.study in store.studies() else None
    target_spec = f"server:{space.path.resolve()}" if space.target_name == "server" else "recorded"
    settings = _settings(space, RunOptions(confirm=False), 0.0, "record", target_spec, space.device)
    run_id = store.start_run(study_name=opts.study, command_line=opts.command_line or shlex.join(sys.argv),
                             space_name=space.name, space_sha256=space.sha256, target=target_spec,
                             preset=space.preset, seed=None, settings=settings)
    decision = Decision(params=params, source=DecisionSource.RECORDED.value, reason=opts.label,
                        parent=parent.number if parent is not None else None, profile=bool(opts.trace))
    handle = store.begin_trial(run_id, opts.study, params, m.config, decision,
                               distributions=space.distributions(), baseline=base is None)
    result = _result(space, m, opts, base)
    outcome = TrialOutcome(handle.number, params, m, result, decision)
    result.diagnosis = diagnose_trial(outcome, parent).as_diagnosis() if parent is not None else None
    store.finish_trial(handle, m, result)
    store.finish_run(run_id, "finished", f"recorded trial {handle.number}: {opts.label}")
    return handle.number, result.diagnosis


def _result(space: Any, m: Any, opts: RecordOptions, base: Any) -> Any:
    from autoopt.trial import TrialResult

    objective = space.objective.value(m)
    weights = space.objective.weights
    base_obj = base.result.objective if base is not None else None
    return TrialResult(state="ok", objective=objective, objective_ci=space.objective.ci(m),
                       objective_name=f"tok_per_s@{next(iter(weights))}" if len(weights) == 1 else None,
                       objective_text=space.objective.describe(), cost_s=m.costs_s["total"],
                       transition_s=float(opts.restart_s),
                       restart_class="restart" if opts.restart_s > 0 else "none",
                       speedup=objective / base_obj if objective and base_obj else None)
