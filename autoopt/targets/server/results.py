"""Result files of serving benchmarks -> one typed ServingResult (the reading half of `autoopt record`).

Read:
  vllm     `vllm bench serve --save-result` JSON: one run, one max_concurrency (several files: several C)
  sglang   `python -m sglang.bench_serving --output-file` JSON lines: one line per run
  aiperf   AIPerf's profile_export_aiperf.json: {metric: {unit, avg, p50, p99, std, ...}} at the top
           level or under "records"; its inter_token_latency is per request (latency - TTFT) /
           (tokens - 1), which is vLLM's TPOT, so it is read as tpot
  autoopt  `autoopt bench-serve --save-result` (and the server target's bench.json)
Every figure is keyed by vLLM's names (metrics.RATES, {mean,median,std,p99}_{ttft,tpot,itl,e2el}_ms).
A file with one run per concurrency has n=1: its spread is unknown, and says so (Summary.n).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoopt.errors import UserError
from autoopt.measurement import Throughput
from autoopt.targets.server.metrics import LATENCIES, RATES, STATS, Summary, maximized, summarize

FORMATS = ("vllm", "sglang", "aiperf", "autoopt")
_SCALARS = RATES + tuple(f"{s}_{m}_ms" for m in LATENCIES for s in STATS)
_SGLANG_RENAMES = {f"{s}_e2e_latency_ms": f"{s}_e2el_ms" for s in STATS}
_AIPERF = {  # AIPerf tag -> (vllm latency name or rate name)
    "time_to_first_token": "ttft", "ttft": "ttft", "inter_token_latency": "tpot", "itl": "tpot",
    "request_latency": "e2el", "output_token_throughput": "output_throughput",
    "request_throughput": "request_throughput", "goodput": "request_goodput",
}
_AIPERF_STATS = {"avg": "mean", "p50": "median", "p99": "p99", "std": "std"}
_TO_MS = {"ms": 1.0, "s": 1e3, "sec": 1e3, "us": 1e-3, "ns": 1e-6}


@dataclass
class ServingResult:
    source: str  # one of FORMATS
    paths: list[str]
    model: str | None = None
    by_concurrency: dict[int, dict[str, Summary]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    duration_s: float | None = None  # the measured runs' seconds (warm-up excluded), when the files say

    def value(self, metric: str, concurrency: int) -> float | None:
        s = self.by_concurrency.get(concurrency, {}).get(metric)
        return s.median if s else None

    def throughput(self, metric: str = "output_throughput") -> dict[str, Throughput]:
        """Measurement.tok_per_s from `metric` (a latency becomes 1000/ms: higher is better)."""
        out = {}
        for c, metrics in sorted(self.by_concurrency.items()):
            s = metrics.get(metric)
            if s is None:
                continue
            if maximized(metric):
                med, lo, hi = s.median, s.ci_low, s.ci_high
            else:
                med, lo, hi = 1000.0 / s.median, 1000.0 / s.ci_high, 1000.0 / s.ci_low
            out[str(c)] = Throughput(med, lo, hi, s.n, [c / v for v in
                                                       (s.values if maximized(metric) else
                                                        [1000.0 / x for x in s.values])])
        return out


def _runs_by_c(runs: list[dict[str, Any]], default_c: int | None, path: Path) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in runs:
        c = r.get("max_concurrency") or default_c
        if not isinstance(c, int) or c <= 0:
            raise UserError(f"{path}: no max_concurrency in the result (unlimited concurrency); give the "
                            f"concurrency it ran at")
        out.setdefault(c, []).append({k: r[k] for k in _SCALARS if r.get(k) is not None})
    return out


def _summaries(by_c: dict[int, list[dict]]) -> dict[int, dict[str, Summary]]:
    return {c: {k: Summary(**v) for k, v in summarize(runs).items()} for c, runs in by_c.items()}


def _load(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    lines = [ln for ln in text.splitlines() if ln.strip()]
    try:
        return [json.loads(ln) for ln in lines]
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: neither JSON nor JSON lines (line {exc.lineno}: {exc.msg})") from None


def detect(doc: Any) -> str | None:
    if isinstance(doc, list) and doc and all(isinstance(d, dict) and "output_throughput" in d for d in doc):
        return "sglang"
    if not isinstance(doc, dict):
        return None
    if doc.get("tool") == "autoopt bench-serve":
        return "autoopt"
    if isinstance(doc.get("records"), (dict, list)) or isinstance(doc.get("output_token_throughput"), dict) \
            or isinstance(doc.get("time_to_first_token"), dict):
        return "aiperf"
    if "output_throughput" in doc and ("duration" in doc or "completed" in doc):
        return "vllm"
    return None


def _aiperf_runs(doc: dict[str, Any], path: Path) -> tuple[dict[str, Any], int | None]:
    records = doc.get("records", doc)
    if isinstance(records, list):
        records = {r.get("tag"): r for r in records if isinstance(r, dict)}
    run: dict[str, Any] = {}
    for tag, name in _AIPERF.items():
        rec = records.get(tag)
        if not isinstance(rec, dict):
            continue
        if name in RATES:
            if rec.get("avg") is not None:
                run[name] = float(rec["avg"])
            continue
        scale = _TO_MS.get(str(rec.get("unit", "ms")).lower())
        if scale is None:
            raise UserError(f"{path}: {tag}: unknown unit {rec.get('unit')!r} (expected ms, s, us or ns)")
        for stat, ours in _AIPERF_STATS.items():
            if rec.get(stat) is not None:
                run[f"{ours}_{name}_ms"] = float(rec[stat]) * scale
    return run, _aiperf_concurrency(doc.get("input_config"))


def _aiperf_concurrency(cfg: Any) -> int | None:
    """The profiled phase's concurrency (AIPerf 0.13: input_config.phases; older: loadgen)."""
    if not isinstance(cfg, dict):
        return None
    for phase in cfg.get("phases") or ():
        if isinstance(phase, dict) and phase.get("kind") == "profiling" and isinstance(phase.get("concurrency"), int):
            return phase["concurrency"]
    c = (cfg.get("loadgen") or {}).get("concurrency")
    return c if isinstance(c, int) else None


def from_autoopt(doc: dict[str, Any], paths: list[str] | None = None) -> ServingResult:
    """autoopt's own load-generator document (bench-serve --save-result, a trial's bench.json)."""
    res = ServingResult(source="autoopt", paths=list(paths or []), model=doc.get("model_id"))
    by_c = {int(r["max_concurrency"]): r["runs"] for r in doc.get("results", [])}
    res.by_concurrency = _summaries({c: [{k: x[k] for k in _SCALARS if x.get(k) is not None}
                                        for x in runs] for c, runs in by_c.items()})
    res.notes += list(doc.get("notes") or [])
    res.duration_s = _duration_s([x for r in doc.get("results", []) for x in r["runs"]])
    return res


def _duration_s(runs: list[Any]) -> float | None:
    """The sum of the runs' `duration` (seconds, as vLLM, SGLang and autoopt write it)."""
    found = [float(r["duration"]) for r in runs if isinstance(r, dict) and isinstance(r.get("duration"), (int, float))]
    return sum(found) if found else None


SERVING_METRICS = ("output_throughput", "request_throughput", "request_goodput", "median_ttft_ms",
                   "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "median_e2el_ms",
                   "p99_e2el_ms")


def serving_field(res: ServingResult) -> dict[str, dict[str, dict[str, float]]]:
    """Measurement.serving: per C the headline figures (median and CI over repeats, n)."""
    return {str(c): {k: {"median": s.median, "ci_low": s.ci_low, "ci_high": s.ci_high, "n": s.n}
                     for k in SERVING_METRICS if (s := metrics.get(k)) is not None}
            for c, metrics in sorted(res.by_concurrency.items())}


def read_result(path: str | Path, concurrency: int | None = None) -> ServingResult:
    """One result file of any FORMATS; `concurrency` for files that do not say theirs."""
    p = Path(path)
    doc = _load(p)
    fmt = detect(doc)
    if fmt is None:
        raise UserError(f"{p}: not a serving benchmark result (expected the JSON of `vllm bench serve "
                        f"--save-result`, SGLang bench_serving JSON lines, AIPerf's profile_export_aiperf.json "
                        f"or `autoopt bench-serve --save-result`)")
    res = ServingResult(source=fmt, paths=[str(p)])
    if fmt == "autoopt":
        res = from_autoopt(doc, [str(p)])
    elif fmt == "vllm":
        res.model = doc.get("model_id")
        res.by_concurrency = _summaries(_runs_by_c([doc], concurrency, p))
        res.duration_s = _duration_s([doc])
    elif fmt == "sglang":
        runs = [{_SGLANG_RENAMES.get(k, k): v for k, v in d.items()} for d in doc]
        res.model = next((str(d.get("model_id") or d["model"]) for d in doc
                          if d.get("model_id") or d.get("model")), None)
        res.by_concurrency = _summaries(_runs_by_c(runs, concurrency, p))
        res.duration_s = _duration_s(doc)
    else:
        run, c = _aiperf_runs(doc, p)
        res.by_concurrency = _summaries(_runs_by_c([run | {"max_concurrency": concurrency or c}], None, p))
        res.notes.append("AIPerf's inter_token_latency is read as TPOT (vLLM's definition of the same figure)")
        dur = doc.get("benchmark_duration")
        if isinstance(dur, dict) and isinstance(dur.get("avg"), (int, float)):
            res.duration_s = float(dur["avg"]) * _TO_MS.get(str(dur.get("unit", "sec")).lower(), 1e3) / 1e3
    return res


def read_results(paths: list[str | Path], concurrency: int | None = None) -> ServingResult:
    """Several files (one per concurrency or per repeat) merged: runs at one C pool across files."""
    if not paths:
        raise UserError("no result files given")
    parts = [read_result(p, concurrency) for p in paths]
    merged = ServingResult(source=parts[0].source if len({r.source for r in parts}) == 1 else "mixed",
                           paths=[x for r in parts for x in r.paths], model=parts[0].model)
    pooled: dict[int, dict[str, list[float]]] = {}
    for r in parts:
        merged.notes += [n for n in r.notes if n not in merged.notes]
        for c, metrics in r.by_concurrency.items():
            for k, s in metrics.items():
                pooled.setdefault(c, {}).setdefault(k, []).extend(s.values)
    merged.by_concurrency = {c: {k: Summary.of(v) for k, v in m.items()} for c, m in pooled.items()}
    durations = [r.duration_s for r in parts if r.duration_s is not None]
    merged.duration_s = sum(durations) if durations else None
    return merged
