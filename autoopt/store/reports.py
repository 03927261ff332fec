"""The documents behind `autoopt history / show / diff / best`: plain dicts, the `--json` output as is
and the input of the rich renderers (autoopt.cli.render_history). Shapes: db/README.md.

Every document has "kind" ("autoopt.history" | "autoopt.trial" | "autoopt.diff" | "autoopt.best"),
"version" (1), "db" (URL, password hidden) and "study". Concurrency keys are strings in JSON.
"""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any, Callable, Sequence

from autoopt.errors import UserError
from autoopt.store import analysis as an
from autoopt.store.db import display_url
from autoopt.store.records import TrialRecord, iso

VERSION = 1
BEST_RULE = ("best = highest median tok/s at C among successful trials whose 95% CI low end is above "
             "the baseline's 95% CI high end; speedup interval = [trial.lo/base.hi, trial.hi/base.lo]")
SORTS = ("objective", "number", "time")
NOT_OK = ("failed", "wrong", "interrupted")


def _head(kind: str, store: Any, study: str) -> dict[str, Any]:
    return {"kind": kind, "version": VERSION, "db": display_url(store.url), "study": study}


def _cost_s(t: TrialRecord) -> float | None:
    """Wall seconds the trial took: the loop's extra["cost_s"], else costs_s total (or their sum)."""
    if isinstance(t.extra.get("cost_s"), (int, float)):
        return float(t.extra["cost_s"])
    costs = t.measurement.costs_s if t.measurement else {}
    if not costs:
        return None
    return costs.get("total", sum(v for k, v in costs.items() if k != "total"))


def summary(t: TrialRecord, base: TrialRecord | None, c: int | None) -> dict[str, Any]:
    """One trial, one line's worth (history rows, best, diff headers)."""
    fig = an.figure(t, c) if c is not None else None
    f = t.failure
    return {
        "number": t.number, "trial_id": t.trial_id, "state": t.state, "run_id": t.run_id,
        "baseline": t.is_baseline,
        "objective": ({"name": an.objective_name(c), **an.interval(fig)} if fig else None),
        "speedup": an.speedup(fig, an.figure(base, c)) if fig and c is not None else None,
        "significant": bool(c is not None and an.significant(fig, an.figure(base, c))),
        "params": t.params,
        "changes": ({k: v for k, v in t.params.items() if base.params.get(k) != v}
                    if base is not None else None),
        "source": t.decision.get("source"), "reason": t.decision.get("reason"),
        "failure": {"kind": f.kind, "reason": f.reason} if f else None,
        "cost_s": _cost_s(t), "started_at": iso(t.started_at), "finished_at": iso(t.finished_at),
        "duration_s": t.duration_s,
    }


def _objective(store: Any, study: str, trials: Sequence[TrialRecord], requested: str | None,
               strict: bool) -> int | None:
    if not strict and not requested:
        try:
            return an.resolve_objective(None, trials, store.runs(study))
        except UserError:  # ambiguous objective: history/show still list the trials, without gains
            return None
    return an.resolve_objective(requested, trials, store.runs(study))


def _nonempty(store: Any, study: str) -> list[TrialRecord]:
    trials = store.trials(study, with_samples=False)
    if not trials:
        raise UserError(f"study {study!r} in {display_url(store.url)} has no trials yet")
    return trials


def history(store: Any, study: str | None = None, *, sort: str = "number", limit: int | None = None,
            failed_only: bool = False, objective: str | None = None) -> dict[str, Any]:
    if sort not in SORTS:
        raise UserError(f"--sort {sort!r}: expected one of {', '.join(SORTS)}")
    study = store.resolve_study(study)
    trials = _nonempty(store, study)
    c = _objective(store, study, trials, objective, strict=False)
    base = store.baseline(study)
    rows = [t for t in trials if t.state in NOT_OK] if failed_only else list(trials)
    if sort == "objective" and c is not None:
        rows.sort(key=lambda t: (an.figure(t, c) is None, -(an.figure(t, c).median if an.figure(t, c) else 0),
                                 t.number))
    elif sort == "time":
        rows.sort(key=lambda t: t.started_at, reverse=True)
    if limit is not None:
        if limit < 1:
            raise UserError(f"--limit must be at least 1, got {limit}")
        rows = rows[:limit]
    doc = _head("autoopt.history", store, study)
    doc.update(objective=an.objective_name(c) if c is not None else None,
               baseline_number=base.number if base else None, sort=sort, failed_only=failed_only,
               counts=store.study_summary(study)["counts"], total=len(trials),
               trials=[summary(t, base, c) for t in rows])
    return doc


def trial_detail(t: TrialRecord, base: TrialRecord | None, c: int | None) -> dict[str, Any]:
    m = t.measurement
    doc = summary(t, base, c)
    tok = {}
    if m is not None:
        for k, tp in m.tok_per_s.items():
            tok[k] = {**an.interval(tp), "n": tp.n, "mbu": m.mbu.get(k),
                      "speedup": an.speedup(an.figure(t, int(k)), an.figure(base, int(k)))}
    f = t.failure
    doc.update(
        config=t.config, decision=t.decision, extra=t.extra, diagnoses=t.diagnoses,
        objective_name=t.objective_name, tok_per_s=tok,
        samples_step_s={k: tp.samples_step_s for k, tp in m.tok_per_s.items()} if m else {},
        buckets_ms=m.buckets_ms if m else {}, bucket_coverage=m.bucket_coverage if m else None,
        kernel_count=m.kernel_count if m else None, costs_s=m.costs_s if m else {},
        transition_s=t.extra.get("transition_s"), correctness=m.correctness if m else {},
        what_ran=m.what_ran if m else {}, environment=m.environment if m else {},
        peak_memory_bytes=m.peak_memory_bytes if m else None,
        failure={"kind": f.kind, "reason": f.reason, "stderr_tail": f.stderr_tail} if f else None,
        predicted_gain=t.decision.get("expected_gain"), predicted_gain_sd=t.decision.get("expected_gain_sd"),
        actual_gain=t.extra.get("actual_gain"),
        gain_vs_baseline=(doc["speedup"]["median"] - 1.0) if doc["speedup"] else None,
    )
    return doc


def show(store: Any, trial: str | int, study: str | None = None,
         objective: str | None = None) -> dict[str, Any]:
    study = store.resolve_study(study)
    t = store.trial(study, trial)
    trials = store.trials(study, with_samples=False)
    c = _objective(store, study, trials, objective, strict=False)
    base = store.baseline(study)
    doc = _head("autoopt.trial", store, study)
    doc.update(objective=an.objective_name(c) if c is not None else None,
               baseline_number=base.number if base else None, trial=trial_detail(t, base, c))
    return doc


def _verdict(a_buckets: dict[str, float], b_buckets: dict[str, float]) -> tuple[str | None, str | None]:
    if not a_buckets or not b_buckets:
        return None, "no verdict: both trials need profile buckets"
    try:
        from autoopt.diagnose import compare
    except ImportError:
        return None, "no verdict: autoopt.diagnose is not available in this installation"
    d = compare(a_buckets, b_buckets, sum(a_buckets.values()), sum(b_buckets.values()))
    return (str(d.verdict) if d.verdict else None), None


def diff(store: Any, a: str | int, b: str | int, study: str | None = None) -> dict[str, Any]:
    study = store.resolve_study(study)
    ta, tb = store.trial(study, a), store.trial(study, b)
    trials = store.trials(study, with_samples=False)
    c = _objective(store, study, trials, None, strict=False)
    base = store.baseline(study)
    ma, mb = ta.measurement, tb.measurement
    per_c = []
    cs = sorted({int(k) for m in (ma, mb) if m for k in m.tok_per_s})
    for k in cs:
        fa, fb = an.figure(ta, k), an.figure(tb, k)
        verdict = ("faster" if an.significant(fb, fa) else "slower" if an.significant(fa, fb) else "noise") \
            if fa and fb else None
        per_c.append({"concurrency": k, "a": an.interval(fa), "b": an.interval(fb),
                      "delta": fb.median - fa.median if fa and fb else None,
                      "delta_pct": (fb.median / fa.median - 1) * 100 if fa and fb and fa.median else None,
                      "ratio": an.speedup(fb, fa), "significant": verdict})
    ab, bb = (ma.buckets_ms if ma else {}), (mb.buckets_ms if mb else {})
    verdict, note = _verdict(ab, bb)
    doc = _head("autoopt.diff", store, study)
    doc.update(objective=an.objective_name(c) if c is not None else None,
               a=summary(ta, base, c), b=summary(tb, base, c),
               knobs=an.knob_diff(ta.params or ta.config, tb.params or tb.config),
               config_changes=an.knob_diff(ta.config, tb.config), tok_per_s=per_c,
               buckets=an.bucket_diff(ab, bb) if ab or bb else [],
               total_ms=({"a": sum(ab.values()), "b": sum(bb.values()),
                          "delta": sum(bb.values()) - sum(ab.values())} if ab and bb else None),
               verdict=verdict, verdict_note=note)
    return doc


_FINGERPRINT_SCRIPT = ("import json, sys\nfrom autoopt.environment import fingerprint\n"
                       "print(json.dumps(fingerprint(sys.argv[1]), default=str))")


def current_fingerprint(device: str) -> dict[str, Any]:
    """This machine's fingerprint for `device`, taken in a child process: fingerprint() imports
    torch, which the CLI process must not (see autoopt.environment). UserError if it cannot run."""
    try:
        proc = subprocess.run([sys.executable, "-c", _FINGERPRINT_SCRIPT, device], capture_output=True,
                              text=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"cannot fingerprint this machine: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"cannot fingerprint this machine: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _environment_check(trial: TrialRecord, base: TrialRecord | None,
                       current: Callable[[str], dict[str, Any]] | None) -> tuple[dict[str, Any], list[str]]:
    """Compare where the trial was measured with this machine (autoopt.environment.same_machine:
    hardware + speed-relevant software; autoopt version and git sha do not count)."""
    warnings: list[str] = []
    measured = trial.measurement.environment if trial.measurement else {}
    try:
        from autoopt.environment import same_machine
    except ImportError:
        same_machine = None
    if base is not None and base.measurement and measured and base.measurement.environment:
        differs = (not same_machine(measured, base.measurement.environment)[0] if same_machine
                   else measured != base.measurement.environment)
        if differs:
            warnings.append(f"trial {trial.number} and baseline {base.number} were measured in different "
                            f"environments: the speed-up compares two machines")
    if not measured:
        note = f"cannot compare environments: trial {trial.number} recorded no fingerprint"
        return {"status": "unknown", "differences": [], "note": note}, warnings + [note]
    if same_machine is None:
        note = "cannot compare environments: autoopt.environment is not available in this installation"
        return {"status": "unknown", "differences": [], "note": note}, warnings + [note]
    try:
        here = (current or current_fingerprint)(str(measured.get("device") or "cpu"))
    except UserError as exc:  # fingerprinting is advice for `best`, not a reason to fail it
        note = f"cannot compare environments: {exc}"
        return {"status": "unknown", "differences": [], "note": note}, warnings + [note]
    same, diffs = same_machine(measured, here)
    if not same:
        warnings.append(f"this machine differs from where trial {trial.number} was measured: "
                        + "; ".join(diffs))
    return {"status": "same" if same else "differs", "differences": diffs, "note": None}, warnings


def best(store: Any, study: str | None = None, *, objective: str | None = None,
         trial: str | int | None = None, current: Callable[[str], dict[str, Any]] | None = None) -> tuple[dict[str, Any], TrialRecord, TrialRecord | None]:
    """-> (document, chosen trial, baseline). UserError on an empty study, no successful trial, or an
    explicitly chosen trial that did not succeed. `current(device)` gives this machine's fingerprint
    (default: current_fingerprint, in a child process)."""
    study = store.resolve_study(study)
    trials = _nonempty(store, study)
    if not any(t.state == "ok" for t in trials):
        raise UserError(f"study {study!r} in {display_url(store.url)} has no successful trial "
                        f"({len(trials)} trials, none ok): nothing to export")
    c = _objective(store, study, trials, objective, strict=True)
    base = store.baseline(study)
    warnings: list[str] = []
    if trial is not None:
        chosen = store.trial(study, trial)
        if chosen.state != "ok":
            f = chosen.failure
            why = f" ({f.kind}: {f.reason})" if f else ""
            raise UserError(f"trial {chosen.number} of study {study!r} is {chosen.state}{why}: only a "
                            f"successful trial can be exported")
        sig = an.significant(an.figure(chosen, c), an.figure(base, c))
        choice = an.BestChoice(chosen, base, c, sig, 0, 0)
        if base is None:
            warnings.append("the study has no successful baseline: no speed-up can be given")
        elif not sig:
            warnings.append(f"trial {chosen.number} does not beat baseline {base.number} outside the noise "
                            f"at C={c}")
    else:
        choice = an.select_best(trials, base, c)
        if not choice.significant:
            warnings.append(f"no trial beats the baseline outside the noise at C={c} "
                            f"({choice.candidates} successful trials): the baseline stays best")
    env, env_warnings = _environment_check(choice.trial, base, current)
    doc = _head("autoopt.best", store, study)
    doc.update(objective=an.objective_name(c), rule=BEST_RULE,
               chosen_by="--trial" if trial is not None else "rule", significant=choice.significant,
               candidates=choice.candidates, significant_count=choice.significant_count,
               trial=summary(choice.trial, base, c), baseline=summary(base, base, c) if base else None,
               tok_per_s={k: an.interval(tp) for k, tp in choice.trial.measurement.tok_per_s.items()},
               baseline_tok_per_s=({k: an.interval(tp) for k, tp in base.measurement.tok_per_s.items()}
                                   if base is not None and base.measurement else {}),
               speedup={str(k): v for k, v in an.speedups(choice.trial, base).items()},
               environment=env, warnings=warnings + env_warnings, export=None)
    return doc, choice.trial, base
