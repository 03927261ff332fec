"""Serving metrics: per request, per run (one concurrency, one repeat) and across repeats.

The names are those of `vllm bench serve --save-result` so the figures compare one to one:
output_throughput (tok/s), request_throughput (req/s), request_goodput (req/s meeting every SLO),
total_token_throughput, and {mean,median,std,p99}_{ttft,tpot,itl,e2el}_ms. Definitions as there:
TTFT is the time to the first streamed token; TPOT a request's (latency - TTFT) / (output tokens - 1);
ITL every gap between two streamed chunks; E2EL the request's latency; throughputs divide totals by
the run's duration (first request sent to last one finished).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from autoopt.errors import UserError
from autoopt.stats import median_ci

LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "std", "p99")
RATES = ("output_throughput", "request_throughput", "request_goodput", "total_token_throughput")
SLO_METRICS = ("ttft_ms", "tpot_ms", "e2el_ms")
OBJECTIVES = RATES + tuple(f"{s}_{m}_ms" for m in LATENCIES for s in ("mean", "median", "p99"))


def maximized(metric: str) -> bool:
    """Rates are maximized, latencies (…_ms) minimized."""
    return not metric.endswith("_ms")


def check_objective(metric: str, where: str = "--objective") -> str:
    if metric not in OBJECTIVES:
        raise UserError(f"{where}: unknown metric {metric!r} (expected one of: {', '.join(OBJECTIVES)})")
    return metric


@dataclass
class RequestResult:
    ok: bool
    prompt_len: int = 0
    output_len: int = 0
    ttft_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    latency_s: float = 0.0
    start_s: float = 0.0  # on the load generator's monotonic clock
    error: str = ""

    @property
    def tpot_s(self) -> float | None:
        return (self.latency_s - self.ttft_s) / (self.output_len - 1) if self.output_len > 1 else None


def parse_slos(text: str | None, where: str = "--slo") -> dict[str, float]:
    """`ttft_ms<=500,tpot_ms<=50` -> {"ttft_ms": 500.0, "tpot_ms": 50.0}."""
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, limit = item.partition("<=")
        name = name.strip()
        if not sep or name not in SLO_METRICS:
            raise UserError(f"{where}: expected METRIC<=MS with METRIC one of {', '.join(SLO_METRICS)} "
                            f"(e.g. ttft_ms<=500,tpot_ms<=50); got {item!r}")
        try:
            out[name] = float(limit)
        except ValueError:
            raise UserError(f"{where}: {name}: expected a number of milliseconds; got {limit!r}") from None
        if out[name] <= 0:
            raise UserError(f"{where}: {name}: expected a positive limit; got {limit!r}")
    return out


def meets_slos(r: RequestResult, slos: dict[str, float]) -> bool:
    values = {"ttft_ms": r.ttft_s * 1e3, "e2el_ms": r.latency_s * 1e3,
              "tpot_ms": (r.tpot_s or 0.0) * 1e3}
    return all(values[k] <= limit for k, limit in slos.items())


def _percentile(xs: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stats(name: str, values_s: list[float]) -> dict[str, float]:
    ms = [v * 1e3 for v in values_s] or [0.0]
    return {f"mean_{name}_ms": statistics.fmean(ms), f"median_{name}_ms": statistics.median(ms),
            f"std_{name}_ms": statistics.pstdev(ms), f"p99_{name}_ms": _percentile(ms, 99)}


def run_metrics(results: list[RequestResult], duration_s: float, slos: dict[str, float]) -> dict[str, Any]:
    """One run's figures, in vllm's field names (plus per-request lists, seconds as there)."""
    done = [r for r in results if r.ok]
    total_in = sum(r.prompt_len for r in done)
    total_out = sum(r.output_len for r in done)
    dur = max(duration_s, 1e-9)
    out: dict[str, Any] = {
        "duration": duration_s, "completed": len(done), "failed": len(results) - len(done),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(done) / dur,
        "request_goodput": (sum(meets_slos(r, slos) for r in done) / dur) if slos else None,
        "output_throughput": total_out / dur, "total_token_throughput": (total_in + total_out) / dur,
    }
    out |= _stats("ttft", [r.ttft_s for r in done])
    out |= _stats("tpot", [t for r in done if (t := r.tpot_s) is not None])
    out |= _stats("itl", [g for r in done for g in r.itl_s])
    out |= _stats("e2el", [r.latency_s for r in done])
    out |= {"input_lens": [r.prompt_len for r in results], "output_lens": [r.output_len for r in results],
            "ttfts": [r.ttft_s for r in results], "itls": [r.itl_s for r in results],
            "errors": [r.error for r in results]}
    return out


@dataclass
class Summary:
    """One metric across repeats: the median of the runs and a 95% CI of it (full range below 6)."""

    median: float
    ci_low: float
    ci_high: float
    n: int
    values: list[float]

    @classmethod
    def of(cls, values: list[float]) -> "Summary":
        med, lo, hi = median_ci(values)
        return cls(med, lo, hi, len(values), list(values))


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every scalar metric of the runs -> its Summary as a dict (None-valued metrics left out)."""
    keys = [k for k in RATES + tuple(f"{s}_{m}_ms" for m in LATENCIES for s in STATS)]
    out: dict[str, dict[str, Any]] = {}
    for k in keys:
        values = [float(r[k]) for r in runs if r.get(k) is not None]
        if values:
            out[k] = vars(Summary.of(values))
    return out
