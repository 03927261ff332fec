"""Recorded tables for the replay target: CSV, JSON lines, a Kernel Tuner cache or a T4 results file
(autoopt.targets.replay.formats reads each, gzipped or not).

A table holds one row per configuration: knob columns, an objective column, and optional columns
  noise        relative sd of one evaluation (draws are seeded by the target)
  measure_s    seconds one evaluation takes (default: the table's/option's measure_s)
  compile_s    seconds paid the first time the configuration is visited
  error        a non-empty reason marks a configuration that was tried and failed
  bucket_<name>_ms   profile buckets (ms per step), so profile guidance works in replay
Columns starting with `metric_` or `_` are carried but are not knobs. Rows absent from the table are
invalid configurations.

A side-car YAML with the same stem (`grid.csv` -> `grid.restart.yaml`) may hold: objective,
direction (maximize|minimize), unit (of the objective, e.g. ms), measure_s, profile_s, fail_s, noise, concurrency, baseline
{knob: value}, restart_s {knob: seconds}, restart_class {knob: class}, buckets {knob: [bucket]},
priors {knob: {value: speed-up of its buckets}}, cuts {knob: [host|launches] or {value: [...]}} (as in a
space file), apply_cost_s {restart class: seconds}, constraints
[expressions, as in a space file], knobs [names], first_use_s {knob: {value: seconds}} (paid the first
time any row with that value is visited: autoopt.targets.replay.target), budget_s (what `bench-search`
gives a run on it by default). Options given to the loader override it.

A side-car of `x.json.gz` is `x.restart.yaml`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autoopt.errors import UserError
from autoopt.targets.replay.formats import KT_FAILURES, T4_FAILURES, read_records, table_stem

RESERVED = {"noise", "measure_s", "compile_s", "error", "status", "reason"}
_TRUE = ("on", "true", "yes", "1")
_FALSE = ("off", "false", "no", "0")


def parse_scalar(text: Any) -> Any:
    """'64' -> 64, '1.5' -> 1.5, '64.0' -> 64, anything else unchanged (stripped if text)."""
    if not isinstance(text, str):
        if isinstance(text, float) and math.isfinite(text) and text.is_integer():
            return int(text)
        return text
    s = text.strip()
    try:
        return int(s)
    except ValueError:
        pass
    try:
        f = float(s)
    except ValueError:
        return s
    return int(f) if math.isfinite(f) and f.is_integer() else f


def norm_value(v: Any) -> str:
    """Canonical text of a knob value, so 64, '64' and 64.0 name the same row."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(parse_scalar(v))


def match_value(values: tuple[Any, ...], raw: Any) -> Any | None:
    """The knob value `raw` names (YAML turns on/off into booleans), or None."""
    by_norm = {norm_value(v): v for v in values}
    if isinstance(raw, bool):
        for word in (_TRUE if raw else _FALSE):
            if word in by_norm:
                return by_norm[word]
        return None
    return by_norm.get(norm_value(raw))


_CANON: dict[tuple[type, Any], str] = {}


def _canon(v: Any) -> str:
    """norm_value of a value already in the table (memoised: keys are built for every lookup)."""
    k = (type(v), v)
    out = _CANON.get(k)
    if out is None:
        out = _CANON[k] = norm_value(v)
    return out


@dataclass
class Row:
    config: dict[str, Any]
    value: float | None  # the raw objective; None when the configuration failed
    error: str | None = None
    failure_kind: str = "exception"
    noise: float | None = None
    measure_s: float | None = None
    compile_s: float = 0.0
    buckets_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class ReplayTable:
    path: Path
    knobs: list[str]
    values: dict[str, tuple[Any, ...]]
    rows: dict[tuple[str, ...], Row]
    objective: str
    minimize: bool
    meta: dict[str, Any]
    sha256: str

    def value_of(self, knob: str, raw: Any) -> Any | None:
        """The table's value of `knob` that `raw` names (cached lookup), or None."""
        if isinstance(raw, bool):
            return match_value(self.values[knob], raw)
        table = self._lookup().get(knob)
        if table is None:
            return None
        hit = table.get(str(raw))
        return hit if hit is not None else table.get(norm_value(raw))

    def _lookup(self) -> dict[str, dict[str, Any]]:
        cache = self.__dict__.get("_lookup_cache")
        if cache is None:
            cache = {k: {**{str(v): v for v in vals}, **{norm_value(v): v for v in vals}}
                     for k, vals in self.values.items()}
            self.__dict__["_lookup_cache"] = cache
        return cache

    def key(self, config: dict[str, Any]) -> tuple[str, ...]:
        out = []
        for k in self.knobs:
            v = self.value_of(k, config[k])
            out.append(norm_value(config[k]) if v is None else _canon(v))
        return tuple(out)

    @property
    def unit(self) -> str | None:
        """The objective's unit: the side-car's or the format's `unit`, else read off the column's name
        (time_ms -> ms, latency_us -> us, step_s -> s, tok_per_s -> tok/s); None when nothing says."""
        if self.meta.get("unit"):
            return str(self.meta["unit"])
        name = self.objective.lower()
        if name.endswith("_per_s"):
            return f"{name[:-len('_per_s')].rsplit('_', 1)[-1]}/s"
        suffix = name.rsplit("_", 1)[-1] if "_" in name else ""
        return suffix if suffix in ("ns", "us", "ms", "s") else None

    def score(self, value: float) -> float:
        """Higher is better: the objective itself, or its reciprocal (a rate) when minimized."""
        return 1.0 / value if self.minimize else value

    def valid_rows(self) -> list[Row]:
        return [r for r in self.rows.values() if r.value is not None]

    def optimum(self) -> Row:
        return max(self.valid_rows(), key=lambda r: self.score(r.value))

    def baseline(self) -> dict[str, Any]:
        base = self.meta.get("baseline")
        if base:
            out = {}
            for k in self.knobs:
                if k not in base:
                    raise UserError(f"{self.path}: baseline in the side-car YAML lacks knob {k!r}")
                v = match_value(self.values[k], base[k])
                if v is None:
                    raise UserError(f"{self.path}: baseline {k}={base[k]!r} is not a value in the table")
                out[k] = v
            return out
        first = next(iter(self.rows.values()))
        return dict(first.config)


def load_table(path: str | Path, objective: str | None = None, minimize: bool | None = None,
               knobs: list[str] | None = None) -> ReplayTable:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"replay table {path} does not exist")
    meta = _side_car(path)
    records, fmt_knobs, fmt_meta, sha256 = read_records(path)
    for key, value in fmt_meta.items():
        meta.setdefault(key, value)
    knobs = knobs or meta.get("knobs") or fmt_knobs
    if not records:
        raise UserError(f"replay table {path} has no rows")
    objective = objective or meta.get("objective") or _guess_objective(records[0])
    if objective not in records[0]:
        raise UserError(f"replay table {path} has no objective column {objective!r} "
                        f"(columns: {', '.join(records[0])})")
    if minimize is None:
        direction = meta.get("direction")
        minimize = (direction == "minimize") if direction else _looks_minimized(objective)
    knobs = knobs or meta.get("knobs") or [
        c for c in records[0] if c != objective and c not in RESERVED and not c.startswith(
            ("bucket_", "metric_", "_"))]
    rows: dict[tuple[str, ...], Row] = {}
    seen_values: dict[str, list[Any]] = {k: [] for k in knobs}
    for i, rec in enumerate(records):
        missing = [k for k in knobs if k not in rec]
        if missing:
            raise UserError(f"replay table {path}: row {i + 1} lacks knob column(s) {missing}")
        row = _row(rec, knobs, objective, path, i)
        for k in knobs:
            if row.config[k] not in seen_values[k]:
                seen_values[k].append(row.config[k])
        rows[tuple(norm_value(row.config[k]) for k in knobs)] = row
    values = {k: tuple(_sorted(v)) for k, v in seen_values.items()}
    table = ReplayTable(path, list(knobs), values, rows, objective, bool(minimize), meta, sha256)
    if not table.valid_rows():
        raise UserError(f"replay table {path} has no valid row (every objective is empty or failed)")
    return table


def _row(rec: dict[str, Any], knobs: list[str], objective: str, path: Path, i: int) -> Row:
    config = {k: parse_scalar(rec[k]) for k in knobs}
    raw = rec.get(objective)
    error = str(rec.get("error") or "").strip() or None
    kind = "exception"
    value = None if raw is None or raw == "" else parse_scalar(raw)
    if isinstance(value, str):  # "InvalidConfig" and friends
        kind = KT_FAILURES.get(value) or T4_FAILURES.get(value, "exception")
        error = error or value
        value = None
    if error and ":" in error and error.split(":", 1)[0] in ("crash", "hang", "oom", "compile", "cuda",
                                                             "excluded", "exception"):
        kind, error = error.split(":", 1)[0], error.split(":", 1)[1].strip()
    if value is not None:
        value = float(value)
        if not math.isfinite(value) or value <= 0 or error:
            error = error or f"objective {raw!r} is not a positive number"
            value = None
    if value is None and not error:
        error = "no objective recorded for this configuration"
    buckets = {c[len("bucket_"):-len("_ms")]: float(v) for c, v in rec.items()
               if c.startswith("bucket_") and c.endswith("_ms") and v not in (None, "")}
    return Row(config=config, value=value, error=error, failure_kind=kind,
               noise=_opt_float(rec.get("noise")), measure_s=_opt_float(rec.get("measure_s")),
               compile_s=_opt_float(rec.get("compile_s")) or 0.0, buckets_ms=buckets)


def _side_car(path: Path) -> dict[str, Any]:
    side = path.with_name(table_stem(path) + ".restart.yaml")
    if not side.exists():
        return {}
    try:
        doc = yaml.safe_load(side.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{side}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise UserError(f"{side}: expected a mapping (restart_s, restart_class, baseline, ...)")
    return doc


def _guess_objective(rec: dict[str, Any]) -> str:
    for name in ("tok_per_s", "objective", "time", "time_us", "time_ms", "latency_ms"):
        if name in rec:
            return name
    raise UserError("replay table: name the objective column with --objective")


def _looks_minimized(name: str) -> bool:
    """time, time_us, latency_ms, step_s: minimize; tok_per_s, gflops, throughput: maximize."""
    n = name.lower()
    if "per_" in n or "/s" in n or "flops" in n or "throughput" in n:
        return False
    return n.startswith(("time", "latency")) or n.endswith(("_ms", "_us", "_s", "time"))


def _opt_float(v: Any) -> float | None:
    if v is None or v == "":
        return None
    return float(v)


def _sorted(vals: list[Any]) -> list[Any]:
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return sorted(vals)
    return vals
