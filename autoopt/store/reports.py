"""The documents behind `autoopt history / show / diff / best`: plain dicts, the `--json` output as is
and the input of the rich renderers (autoopt.cli.render_history). Shapes: db/README.md.

Every document has "kind" ("autoopt.history" | "autoopt.trial" | "autoopt.diff" | "autoopt.best"),
"version" (1), "db" (URL, password hidden) and "study". Concurrency keys are strings in JSON.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any, Callable, Sequence

from autoopt.environment import same_machine
from autoopt.errors import UserError
from autoopt.store import analysis as an
from autoopt.store.records import TrialRecord, iso
from autoopt.trial import DecisionSource

VERSION = 1
BEST_RULE = ("best = among successful trials whose 95% CI low end is above their own run's baseline's 95% CI high "
             "end, the highest median at C when all runs share one machine, else the highest speed-up over that "
             "baseline (a minimised objective compared as its reciprocal), leaving out a trial whose re-measurement "
             "disagrees with it and leaves the win in doubt; speedup interval = [trial.lo/base.hi, trial.hi/base.lo]")
SORTS = ("objective", "number", "time")
NOT_OK = ("failed", "wrong", "interrupted")


def _head(kind: str, store: Any, study: str) -> dict[str, Any]:
    return {"kind": kind, "version": VERSION, "db": store.shown_url(), "study": study}


def _cost_s(t: TrialRecord) -> float | None:
    """Wall seconds the trial took, as stored with its result (None while it runs or when nothing
    recorded a cost)."""
    if t.state == "running" or (not t.result.cost_s and not (t.measurement and t.measurement.costs_s)):
        return None
    return t.result.cost_s


def _decision(t: TrialRecord) -> dict[str, Any]:
    return t.decision.to_json() if t.decision is not None else {
        "source": None, "reason": None, "expected_gain": None, "expected_gain_sd": None,
        "expected_cost_s": None, "extra": {}}


def transition(t: TrialRecord) -> dict[str, Any] | None:
    """Predicted (the one cost model's estimate, stored with the decision) vs actual transition."""
    cost = t.decision.expected_cost if t.decision is not None else None
    if cost is None and t.state == "running":
        return None
    return {"restart_class": t.result.restart_class,
            "predicted_s": cost.transition_s if cost is not None else None,
            "predicted_measure_s": cost.measure_s if cost is not None else None,
            "predicted_class": cost.restart_class if cost is not None else None,
            "cached": cost.cached if cost is not None else None,
            "actual_s": t.result.transition_s if t.state != "running" else None}


def summary(t: TrialRecord, base: TrialRecord | None, c: an.ObjectiveKey | None,
            unit: an.ObjectiveUnit = an.TOK_PER_S) -> dict[str, Any]:
    """One trial, one line's worth (history rows, best, diff headers). `base`: the baseline of the
    trial's own session (analysis.baseline_before), which its speed-up is over; `unit`: what the
    objective measures ("objective" is the stored rate, "objective_value" the same in that unit)."""
    fig = an.figure(t, c) if c is not None else None
    f = t.failure
    return {
        "number": t.number, "trial_id": t.trial_id, "state": t.state, "run_id": t.run_id,
        "baseline": t.is_baseline, "baseline_of": base.number if base is not None else None,
        "objective": ({"name": an.objective_name(c), **an.interval(fig)} if fig else None),
        "objective_value": unit.value(an.interval(fig)) if fig else None,
        "speedup": an.speedup(fig, an.figure(base, c)) if fig and c is not None else None,
        "significant": bool(c is not None and an.significant(fig, an.figure(base, c))),
        "params": t.params,
        "changes": ({k: v for k, v in t.params.items() if base.params.get(k) != v}
                    if base is not None else None),
        "source": t.decision.source if t.decision else None,
        "reason": t.decision.reason if t.decision else None,
        "failure": {"kind": f.kind, "reason": f.reason} if f else None,
        "cost_s": _cost_s(t), "started_at": iso(t.started_at), "finished_at": iso(t.finished_at),
        "duration_s": t.duration_s,
    }


def _objective(store: Any, study: str, trials: Sequence[TrialRecord], requested: str | None,
               strict: bool) -> an.ObjectiveKey | None:
    if not strict and not requested:
        try:
            return an.resolve_objective(None, trials, store.runs(study))
        except UserError:  # ambiguous objective: history/show still list the trials, without gains
            return None
    return an.resolve_objective(requested, trials, store.runs(study))


def _objective_head(c: an.ObjectiveKey | None) -> dict[str, Any]:
    """A document's "objective" ("tok_per_s@16", "tok_per_s@mix" or None) and, for the mix, its
    weights ("objective_mix": {"1": 0.2, ...}; analysis.key_of reads the two back)."""
    return {"objective": an.objective_name(c) if c is not None else None,
            "objective_mix": c.to_json() if isinstance(c, an.Mix) else None}


def _nonempty(store: Any, study: str, trials: list[TrialRecord] | None = None) -> list[TrialRecord]:
    trials = store.trials(study, with_samples=False) if trials is None else trials
    if not trials:
        raise UserError(f"study {study!r} in {store.shown_url()} has no trials yet")
    return trials


def best_number(trials: Sequence[TrialRecord], c: an.ObjectiveKey | None) -> tuple[int | None, bool]:
    """(the trial `autoopt best` takes, whether it beats its session's baseline outside the noise):
    analysis.select_best, the one rule; (None, False) without an objective or a baseline at C."""
    if c is None:
        return None, False
    try:
        choice, _ = choose_best(trials, an.session_baselines(trials), c)
    except UserError:
        return None, False
    return choice.trial.number, choice.significant


def choose_best(trials: Sequence[TrialRecord], baselines: list[TrialRecord], c: an.ObjectiveKey
                ) -> tuple[an.BestChoice, list[tuple[int, str]]]:
    """analysis.select_best, leaving out each pick whose win a re-measurement leaves in doubt
    (confirmation_disagreement refuses it), with why: the next pick, else the baseline. A noisy
    machine (the README's 2-minute CPU run: baselines ±12-27 % on a 2-core VM) makes such a pick now
    and then; `best` never exports it unasked (`--trial N --force` does), nor stops at it."""
    pool, left_out = list(trials), []
    while True:
        choice = an.select_best(pool, baselines, c)
        why, refuse = confirmation_disagreement(trials, choice.trial, c, baselines) \
            if choice.significant else (None, False)
        if not refuse:  # counted over every trial, the left-out ones too
            return dataclasses.replace(choice, candidates=choice.candidates + len(left_out),
                                       significant_count=choice.significant_count + len(left_out)), left_out
        left_out.append((choice.trial.number, why))
        pool = [t for t in pool if t.trial_id != choice.trial.trial_id]


def _baselines_head(baselines: Sequence[TrialRecord], unit: an.ObjectiveUnit) -> dict[str, Any]:
    return {"objective_unit": unit.to_json(), "baselines": [b.number for b in baselines],
            "baseline_number": baselines[-1].number if baselines else None}


def history(store: Any, study: str | None = None, *, sort: str = "number", limit: int | None = None,
            failed_only: bool = False, objective: str | None = None,
            trials: list[TrialRecord] | None = None) -> dict[str, Any]:
    """The history document. Each trial's speed-up is over the baseline of its own session (the
    latest measured before it, as `autoopt best` reads it); "baseline_number" is the latest
    baseline, "baselines" all of them. `trials`: the study's trials when the caller read them."""
    if sort not in SORTS:
        raise UserError(f"--sort {sort!r}: expected one of {', '.join(SORTS)}")
    study = store.resolve_study(study)
    trials = _nonempty(store, study, trials)
    c = _objective(store, study, trials, objective, strict=False)
    baselines, unit = an.session_baselines(trials), an.objective_unit(trials)
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
    best, best_sig = best_number(trials, c)
    doc = _head("autoopt.history", store, study)
    doc.update(**_objective_head(c), **_baselines_head(baselines, unit),
               best_number=best, best_significant=best_sig, sort=sort, failed_only=failed_only,
               counts=store.study_summary(study)["counts"], total=len(trials),
               trials=[summary(t, an.baseline_before(t, baselines), c, unit) for t in rows])
    return doc


def trial_detail(t: TrialRecord, base: TrialRecord | None, c: an.ObjectiveKey | None,
                 unit: an.ObjectiveUnit = an.TOK_PER_S) -> dict[str, Any]:
    """One trial in full (`autoopt show`); `base` and `unit` as for summary."""
    m = t.measurement
    doc = summary(t, base, c, unit)
    tok = {}
    if m is not None:
        for k, tp in m.tok_per_s.items():
            tok[k] = {**an.interval(tp), "value": unit.value(an.interval(tp)), "n": tp.n, "mbu": m.mbu.get(k),
                      "speedup": an.speedup(an.figure(t, int(k)), an.figure(base, int(k)))}
    f = t.failure
    doc.update(
        config=t.config, decision=_decision(t), extra=t.result.to_json(), diagnoses=t.diagnoses,
        objective_name=t.objective_name, tok_per_s=tok,
        samples_step_s={k: tp.samples_step_s for k, tp in m.tok_per_s.items()} if m else {},
        buckets_ms=m.buckets_ms if m else {}, bucket_coverage=m.bucket_coverage if m else None,
        kernel_count=m.kernel_count if m else None, costs_s=m.costs_s if m else {},
        transition_s=t.result.transition_s if t.state != "running" else None,
        transition=transition(t), correctness=m.correctness if m else {},
        guard_margins=an.guard_margins(m.correctness) if m else {},  # error / tolerance (1.0: at the limit)
        what_ran=m.what_ran if m else {}, environment=m.environment if m else {},
        peak_memory_bytes=m.peak_memory_bytes if m else None, serving=m.serving if m else {},
        failure={"kind": f.kind, "reason": f.reason, "stderr_tail": f.stderr_tail} if f else None,
        predicted_gain=t.decision.expected_gain if t.decision else None,
        predicted_gain_sd=t.decision.expected_gain_sd if t.decision else None,
        actual_gain=t.result.diagnosis.actual_gain if t.result.diagnosis else None,
        gain_vs_baseline=(doc["speedup"]["median"] - 1.0) if doc["speedup"] else None,
    )
    return doc


def show(store: Any, trial: str | int, study: str | None = None,
         objective: str | None = None) -> dict[str, Any]:
    study = store.resolve_study(study)
    t = store.trial(study, trial)
    trials = store.trials(study, with_samples=False)
    c = _objective(store, study, trials, objective, strict=False)
    baselines, unit = an.session_baselines(trials), an.objective_unit(trials)
    base = an.baseline_before(t, baselines)
    doc = _head("autoopt.trial", store, study)
    doc.update(**_objective_head(c), **_baselines_head(baselines, unit),
               trial=trial_detail(t, base, c, unit))
    doc["baseline_number"] = base.number if base is not None else None  # this trial's own
    return doc


def _verdict(a_buckets: dict[str, float], b_buckets: dict[str, float]) -> tuple[str | None, str | None]:
    if not a_buckets or not b_buckets:
        return None, "no verdict: both trials need profile buckets"
    from autoopt.profile.diff import compare  # its rules compile a few dozen regexes: diff only

    d = compare(a_buckets, b_buckets, sum(a_buckets.values()), sum(b_buckets.values()))
    return (str(d.verdict) if d.verdict else None), None


def _diff_row(concurrency: int | str, fa: Any, fb: Any, unit: an.ObjectiveUnit) -> dict[str, Any]:
    """One row of the diff's tok/s table: a concurrency, or "mix" for the run's weighted mix."""
    verdict = ("faster" if an.significant(fb, fa) else "slower" if an.significant(fa, fb) else "noise") \
        if fa and fb else None
    return {"concurrency": concurrency, "a": an.interval(fa), "b": an.interval(fb),
            "a_value": unit.value(an.interval(fa)), "b_value": unit.value(an.interval(fb)),
            "delta": fb.median - fa.median if fa and fb else None,
            "delta_pct": (fb.median / fa.median - 1) * 100 if fa and fb and fa.median else None,
            "ratio": an.speedup(fb, fa), "significant": verdict}


def diff(store: Any, a: str | int, b: str | int, study: str | None = None) -> dict[str, Any]:
    study = store.resolve_study(study)
    ta, tb = store.trial(study, a), store.trial(study, b)
    trials = store.trials(study, with_samples=False)
    c = _objective(store, study, trials, None, strict=False)
    baselines, unit = an.session_baselines(trials), an.objective_unit(trials)
    ma, mb = ta.measurement, tb.measurement
    cs = sorted({int(k) for m in (ma, mb) if m for k in m.tok_per_s})
    per_c = [_diff_row(k, an.figure(ta, k), an.figure(tb, k), unit) for k in cs]
    if isinstance(c, an.Mix):  # the figure the run ranked by, last: "mix"
        per_c.append(_diff_row(an.MIX, an.figure(ta, c), an.figure(tb, c), unit))
    ab, bb = (ma.buckets_ms if ma else {}), (mb.buckets_ms if mb else {})
    verdict, note = _verdict(ab, bb)
    doc = _head("autoopt.diff", store, study)
    doc.update(**_objective_head(c), objective_unit=unit.to_json(),
               a=summary(ta, an.baseline_before(ta, baselines), c, unit),
               b=summary(tb, an.baseline_before(tb, baselines), c, unit),
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
    if base is not None and base.measurement and measured and base.measurement.environment:
        if not same_machine(measured, base.measurement.environment)[0]:
            warnings.append(f"trial {trial.number} and baseline {base.number} were measured in different "
                            f"environments: the speed-up compares two machines")
    if not measured:
        note = f"cannot compare environments: trial {trial.number} recorded no fingerprint"
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
        raise UserError(f"study {study!r} in {store.shown_url()} has no successful trial "
                        f"({len(trials)} trials, none ok): nothing to export")
    c = _objective(store, study, trials, objective, strict=True)
    baselines, unit = an.session_baselines(trials), an.objective_unit(trials)
    warnings: list[str] = []
    left_out: list[tuple[int, str]] = []
    if trial is not None:
        chosen = store.trial(study, trial)
        if chosen.state != "ok":
            f = chosen.failure
            why = f" ({f.kind}: {f.reason})" if f else ""
            raise UserError(f"trial {chosen.number} of study {study!r} is {chosen.state}{why}: only a "
                            f"successful trial can be exported")
        base = an.baseline_before(chosen, baselines)  # its own session's, as the rule reads it
        sig = an.significant(an.figure(chosen, c), an.figure(base, c))
        choice = an.BestChoice(chosen, base, c, sig, 0, 0)
        if base is None:
            warnings.append("the study has no successful baseline: no speed-up can be given")
        elif not sig:
            warnings.append(f"trial {chosen.number} does not beat baseline {base.number} outside the noise "
                            f"at {an.where(c)}")
    else:
        choice, left_out = choose_best(trials, baselines, c)
        warnings += [f"trial #{n} left out: {why}" for n, why in left_out]
        base = choice.baseline
        if not choice.significant:
            warnings.append(f"no trial beats the baseline outside the noise at {an.where(c)} "
                            f"({choice.candidates} successful trials): the baseline stays best")
    disagreement, refuse = confirmation_disagreement(trials, choice.trial, c, baselines)
    if disagreement:
        warnings.append(disagreement)
    env, env_warnings = _environment_check(choice.trial, base, current)
    doc = _head("autoopt.best", store, study)
    figures = lambda t: ({k: an.interval(tp) for k, tp in t.measurement.tok_per_s.items()}  # noqa: E731
                         if t is not None and t.measurement else {})
    doc.update(**_objective_head(c), objective_unit=unit.to_json(), rule=BEST_RULE,
               chosen_by="--trial" if trial is not None else "rule", significant=choice.significant,
               candidates=choice.candidates, significant_count=choice.significant_count,
               trial=summary(choice.trial, base, c, unit), baseline=summary(base, base, c, unit) if base else None,
               tok_per_s=figures(choice.trial), baseline_tok_per_s=figures(base),
               values={k: unit.value(iv) for k, iv in figures(choice.trial).items()},
               baseline_values={k: unit.value(iv) for k, iv in figures(base).items()},
               speedup={str(k): v for k, v in an.speedups(choice.trial, base).items()},
               environment=env, warnings=warnings + env_warnings, export=None,
               left_out=[n for n, _ in left_out],  # picks a disagreeing re-measurement put in doubt
               export_refused=disagreement if refuse else None)  # `best --export` needs --force while set
    return doc, choice.trial, base


def confirmation_disagreement(trials: Sequence[TrialRecord], chosen: TrialRecord, c: an.ObjectiveKey,
                              baselines: list[TrialRecord]) -> tuple[str | None, bool]:
    """Why the chosen trial's figure is in doubt, and whether `best --export` refuses it: a
    re-measurement of the same configuration (the run's final confirmation, either way round) that
    failed (refused), or whose 95 % CI at C misses the trial's (analysis.confirmation_verdict: refused
    only when one of the two does not beat its baseline). (None, False) when none disagrees."""
    def conf_of(t: TrialRecord) -> int | None:
        d = t.decision
        return d.confirms if d is not None and d.kind is DecisionSource.CONFIRM else None

    def ci(t: TrialRecord | None) -> an.Interval | None:
        f = an.figure(t, c) if t is not None else None
        return (f.ci_low, f.ci_high) if f is not None else None

    pairs = [(chosen, t) for t in trials if conf_of(t) == chosen.number]
    if conf_of(chosen) is not None:
        pairs += [(t, chosen) for t in trials if t.number == conf_of(chosen)]
    for orig, conf in pairs:
        a, b = an.figure(orig, c), an.figure(conf, c)
        if b is None:
            return (f"the confirmation #{conf.number} of trial #{orig.number} is {conf.state}: the win is "
                    "not confirmed"), True
        verdict = an.confirmation_verdict(ci(orig), ci(conf), ci(an.baseline_before(orig, baselines)),
                                          ci(an.baseline_before(conf, baselines))) if a is not None else None
        if verdict is not None:
            refuse, why = verdict
            return (f"the confirmation #{conf.number} of trial #{orig.number} disagrees with it at {an.where(c)} "
                    f"({b.median:.4g} vs {a.median:.4g} tok/s, the 95% CIs do not overlap){why}"), refuse
    return None, False
