"""What the plots show, computed once from the documents; drawn by textplot.py (terminal) and by
autoopt.cli.report (SVG and PNG). Nothing here draws.

convergence   each finished trial's speed-up over the baseline at the objective's C (with its
              conservative interval) against wall time since the study's first trial started, the
              best so far by `autoopt best`'s rule (outside the noise, else the baseline), where a
              new `autoopt run` joined the study, and the trials that restarted the worker
effects       per knob value: the median speed-up of the successful trials that had that value and a
              distribution-free 95 % CI of that median (binomial order statistics,
              autoopt.stats.median_ci; with n < 6 the CI is the full range and covers less than 95 %).
              It is marginal, not controlled: those trials differ in their other knobs too.
buckets       each profiled trial's ms per decode step by bucket, in profile order
predictions   each decision's expected gain over its incumbent against the gain measured
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from autoopt.stats import median_ci

MIN_N_FOR_95 = 6  # median_ci's smallest sample with a true 95 % interval


def _time(iso: str | None) -> datetime | None:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")) if iso else None


@dataclass(frozen=True)
class Point:
    number: int
    x_s: float
    y: float
    lo: float
    hi: float
    significant: bool


@dataclass
class Convergence:
    y_label: str
    points: list[Point] = field(default_factory=list)
    failed_x_s: list[tuple[int, float]] = field(default_factory=list)  # (number, x): no figure
    best_steps: list[tuple[float, float, int]] = field(default_factory=list)  # (x, y, number)
    run_starts: list[tuple[float, int]] = field(default_factory=list)  # (x, run id) after the first
    restarts: list[tuple[float, int]] = field(default_factory=list)  # (x, number): worker restarted
    x_max_s: float = 0.0


def convergence(rows: list[dict[str, Any]], restart_classes: dict[int, str] | None = None,
                objective: str | None = None) -> Convergence:
    """rows: summary rows (history document). restart_classes: number -> extra.restart_class."""
    starts = [_time(r["started_at"]) for r in rows if r["started_at"]]
    label = f"speed-up over the baseline at {objective}" if objective else "speed-up over the baseline"
    out = Convergence(label)
    if not starts:
        return out
    t0 = min(starts)
    done = sorted((r for r in rows if r["finished_at"]), key=lambda r: (r["finished_at"], r["number"]))
    best_y, seen_runs = 1.0, set()
    for r in sorted(rows, key=lambda r: (r["started_at"] or "", r["number"])):
        if r["run_id"] not in seen_runs:
            if seen_runs and r["started_at"]:
                out.run_starts.append(((_time(r["started_at"]) - t0).total_seconds(), r["run_id"]))
            seen_runs.add(r["run_id"])
    for r in done:
        x = (_time(r["finished_at"]) - t0).total_seconds()
        out.x_max_s = max(out.x_max_s, x)
        if (restart_classes or {}).get(r["number"]) == "restart":
            out.restarts.append((x, r["number"]))
        sp = r["speedup"]
        if r["state"] != "ok" or not sp:
            out.failed_x_s.append((r["number"], x))
            continue
        out.points.append(Point(r["number"], x, sp["median"], sp["ci_low"], sp["ci_high"], r["significant"]))
        if r["baseline"] and not out.best_steps:
            out.best_steps.append((x, 1.0, r["number"]))
        elif r["significant"] and sp["median"] > best_y:
            best_y = sp["median"]
            out.best_steps.append((x, best_y, r["number"]))
    return out


@dataclass(frozen=True)
class Effect:
    knob: str
    value: str
    n: int
    median: float
    lo: float
    hi: float

    @property
    def full_range(self) -> bool:
        """True when n is too small for a 95 % interval: [lo, hi] is then the sample's range."""
        return self.n < MIN_N_FOR_95


def effects(rows: list[dict[str, Any]]) -> list[list[Effect]]:
    """One list per knob that took at least two values among successful trials, the knob whose
    values' medians spread the most first; values in order of appearance."""
    by_knob: dict[str, dict[str, list[float]]] = {}
    for r in sorted(rows, key=lambda r: r["number"]):
        if r["state"] != "ok" or not r["speedup"]:
            continue
        for k, v in (r["params"] or {}).items():
            by_knob.setdefault(k, {}).setdefault(str(v), []).append(r["speedup"]["median"])
    out = []
    for knob, values in by_knob.items():
        if len(values) < 2:
            continue
        group = [Effect(knob, v, len(xs), *median_ci(xs)) for v, xs in values.items()]
        out.append(group)
    out.sort(key=lambda g: (-(max(e.median for e in g) / min(e.median for e in g)), g[0].knob))
    return out


def buckets(details: list[dict[str, Any]]) -> tuple[list[str], list[tuple[int, dict[str, float]]]]:
    """-> (bucket names in profile order, [(trial number, {bucket: ms per step})]) for profiled trials."""
    names: list[str] = []
    out = []
    for d in details:
        b = d.get("buckets_ms") or {}
        if not b:
            continue
        for name in b:
            if name not in names:
                names.append(name)
        out.append((d["number"], dict(b)))
    return names, out


@dataclass(frozen=True)
class Prediction:
    number: int
    predicted: float  # expected gain over the incumbent (0.1 = +10 %)
    predicted_sd: float | None
    measured: float
    source: str | None


def predictions(details: list[dict[str, Any]]) -> list[Prediction]:
    return [Prediction(d["number"], d["predicted_gain"], d.get("predicted_gain_sd"), d["actual_gain"],
                       d.get("source"))
            for d in details if d.get("predicted_gain") is not None and d.get("actual_gain") is not None]


def restart_classes(details: list[dict[str, Any]]) -> dict[int, str]:
    return {d["number"]: str((d.get("extra") or {}).get("restart_class")) for d in details}
