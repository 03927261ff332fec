"""After a trial: predicted vs actual gain, and one line on why (the bucket diff against its parent).

The parent is the configuration the move was made from (the incumbent when the agent decided; the
decision's `parent` holds its trial number). The bucket diff comes from
`autoopt.profile.diff.compare`, so the line reads like the case study:

    predicted +8.0% ± 4.0%, measured +1.8% vs #3: GEMM -60 ms (...), copy_cast +46 ms: casts ate 77%
    of the GEMM gain; net -14 ms (-1.2%)

Without profiles on both sides the line says so and gives the figures only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autoopt.profile.diff import compare
from autoopt.trial import DecisionSource, Diagnosis


@dataclass
class TrialDiagnosis:
    number: int
    parent: int | None
    predicted_gain: float | None
    predicted_sd: float | None
    actual_gain: float | None  # objective / parent objective - 1
    surprise_sd: float | None  # (actual - predicted) / predicted sd
    buckets_line: str | None
    line: str

    def as_diagnosis(self) -> Diagnosis:
        """The record the loop stores (autoopt.trial.Diagnosis); the agent's own fields as its detail."""
        return Diagnosis(self.line, self.parent, self.predicted_gain, self.actual_gain,
                         detail={"number": self.number, "predicted_sd": self.predicted_sd,
                                 "surprise_sd": self.surprise_sd, "buckets_line": self.buckets_line})


def diagnose_trial(outcome: Any, parent: Any | None) -> TrialDiagnosis:
    """One line for `outcome` (a TrialOutcome) against `parent` (a TrialOutcome or None)."""
    d = outcome.decision
    pred = getattr(d, "expected_gain", None) if d is not None else None
    pred_sd = getattr(d, "expected_gain_sd", None) if d is not None else None
    pnum = getattr(parent, "number", None)
    if outcome.objective is None:
        f = outcome.measurement.failure
        why = f"{f.kind}: {f.reason}" if f is not None else outcome.measurement.status
        line = f"failed ({why})" + (f"; predicted {_pct(pred, pred_sd)}" if pred is not None else "")
        return TrialDiagnosis(outcome.number, pnum, pred, pred_sd, None, None, None, line)
    actual = None
    if parent is not None and parent.objective:
        actual = outcome.objective / parent.objective - 1.0
    surprise = None
    if actual is not None and pred is not None and pred_sd:
        surprise = (actual - pred) / pred_sd
    buckets_line = _bucket_line(parent, outcome)
    if buckets_line:
        buckets_line += _host_bound_note(parent, outcome)
    parts = []
    if pred is not None:
        parts.append(f"predicted {_pct(pred, pred_sd)}")
    if actual is not None:
        parts.append(f"measured {100 * actual:+.1f}% vs #{pnum}")
    head = ", ".join(parts) if parts else "measured"
    if surprise is not None and abs(surprise) > 2:
        head += f" ({'better' if surprise > 0 else 'worse'} than expected by {abs(surprise):.1f} sd)"
    tail = buckets_line or (_unprofiled(parent, outcome) if parent is not None else "no parent to compare")
    return TrialDiagnosis(outcome.number, pnum, pred, pred_sd, actual, surprise, buckets_line,
                          f"{head}: {tail}")


def _unprofiled(parent: Any, outcome: Any) -> str:
    """Which side of the bucket diff has no profile (a confirmation re-measures the best without
    profiling it: its line once read "no profile on both sides", though its parent had one)."""
    missing = [f"#{t.number}" for t in (parent, outcome) if not t.measurement.buckets_ms]
    confirm = outcome.decision is not None and outcome.decision.kind is DecisionSource.CONFIRM
    why = " (a confirmation re-measures, it does not profile)" if confirm and len(missing) == 1 else ""
    return f"no bucket diff: {' and '.join(missing)} not profiled{why}"


def _bucket_line(parent: Any | None, outcome: Any) -> str | None:
    if parent is None:
        return None
    a = parent.measurement.buckets_ms or {}
    b = outcome.measurement.buckets_ms or {}
    if not a or not b:
        return None
    ta, tb = _step_ms(parent, a), _step_ms(outcome, b)
    return compare(a, b, ta, tb).verdict


HOST_BOUND_COVERAGE = 0.5


def _host_bound_note(parent: Any, outcome: Any) -> str:
    """When both profiles explain less than half of the step's wall time (an eager GPU step is
    launch-bound: the H200 ran kernels 8 % of the start's wall), bucket savings barely reach tok/s:
    say so, or the line reads as if the kernels decided the result."""
    a, b = parent.measurement.bucket_coverage, outcome.measurement.bucket_coverage
    if a is None or b is None or max(a, b) >= HOST_BOUND_COVERAGE:
        return ""
    return (f"; host-bound: the profiled work covers {100 * a:.0f}% -> {100 * b:.0f}% of the step's "
            f"wall time, so kernel time saved barely reaches tok/s")


def _step_ms(outcome: Any, buckets: dict[str, float]) -> float | None:
    """The step's wall time when the objective is tok/s at one concurrency, else the bucket sum."""
    tps = outcome.measurement.tok_per_s or {}
    if len(tps) == 1:
        (c, tp), = tps.items()
        try:
            step = int(c) / tp.median * 1000.0
        except (ValueError, ZeroDivisionError):
            return None
        # trust it only when the profile covers most of it (the same units, the same step)
        if math.isfinite(step) and 0.5 * sum(buckets.values()) <= step <= 2.0 * sum(buckets.values()):
            return step
    return None


def _pct(x: float | None, sd: float | None) -> str:
    if x is None:
        return "?"
    return f"{100 * x:+.1f}%" + (f" ± {100 * sd:.1f}%" if sd is not None else "")
