"""The statistics every layer shares, computed in one place: the distribution-free confidence
interval of a median, and the speed-up of one figure over another with its conservative interval.

    speedup   of T over B: median T.med / B.med, interval [T.lo / B.hi, T.hi / B.lo] (the extreme
              ratios of the two 95 % CIs; db/README.md "Definitions").
    median_ratio  of two sets of runs (bench-search's seeds), with a bootstrap interval: whether a
              ratio of medians over twenty seeds is a result or inside the seeds' scatter.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Protocol, Sequence


@dataclass(frozen=True)
class Interval:
    median: float
    ci_low: float
    ci_high: float

    def to_dict(self) -> dict[str, float]:
        return {"median": self.median, "ci_low": self.ci_low, "ci_high": self.ci_high}


class Figure(Protocol):
    median: float
    ci_low: float
    ci_high: float


def median_ci(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Median and a distribution-free confidence interval for it (binomial order statistics).

    With n samples the CI is [x_(l), x_(u)] where l, u are chosen so that
    P(l <= #samples below the true median < u) >= confidence. Needs n >= 6 for a 95% interval;
    with fewer samples the interval is the full range (honestly wide).
    """
    if not values:
        raise ValueError("median_ci of no values")
    xs = sorted(values)
    n = len(xs)
    med = statistics.median(xs)
    alpha = 1.0 - confidence
    # smallest k with P(Bin(n, 1/2) <= k-1) >= alpha/2  ->  CI = [x_(k), x_(n-k+1)] (1-based)
    cdf, k = 0.0, 0
    while k < n:
        p = math.comb(n, k) * 0.5 ** n
        if cdf + p > alpha / 2:
            break
        cdf += p
        k += 1
    if k == 0:
        return med, xs[0], xs[-1]
    return med, xs[k - 1], xs[n - k]


def speedup(t: Figure, base: Figure) -> Interval | None:
    """t over base with the conservative interval; None when the base has no positive figure.
    Either may be any figure with median / ci_low / ci_high (an Interval, a measured Throughput)."""
    if base.median <= 0 or base.ci_low <= 0 or base.ci_high <= 0:
        return None
    return Interval(t.median / base.median, t.ci_low / base.ci_high, t.ci_high / base.ci_low)


@dataclass(frozen=True)
class RatioInterval:
    """median(num) / median(den) over two sets of runs, and its bootstrap interval. A median may be
    inf ("never reached"): a finite one over inf is 0, inf over a finite one is inf, and both inf is
    no ratio (None), counted as a tie (1) inside the resamples."""

    ratio: float | None
    low: float
    high: float
    share_below_1: float  # the resamples in which num's median was the smaller (num "faster")

    def text(self) -> str:
        def x(r: float | None) -> str:
            return "both never" if r is None else ("never" if math.isinf(r) else f"{r:.2f}x")
        return f"{x(self.ratio)} (95% bootstrap {x(self.low)}-{x(self.high)})"


def reach_ratio(num: float, den: float) -> float | None:
    """num / den for medians that may be inf ("never"): a finite one over "never" is 0, "never" over a
    finite one is inf, both "never" is no ratio (None)."""
    if math.isinf(num) and math.isinf(den):
        return None
    return num / den if math.isfinite(den) else 0.0


def median_ratio(num: Sequence[float], den: Sequence[float], resamples: int = 10_000, seed: int = 0,
                 confidence: float = 0.95) -> RatioInterval:
    """The ratio of the medians of `num` and `den` with a percentile bootstrap interval: each set
    resampled with replacement on its own, `resamples` times (seeded: the same runs give the same
    interval). Medians follow statistics.median, so a median between a finite run and a "never" is
    "never", as bench-search's quartiles say."""
    import numpy as np

    if not num or not den:
        raise ValueError("median_ratio needs runs on both sides")
    rng = np.random.default_rng(seed)
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    ma = np.median(a[rng.integers(0, len(a), (resamples, len(a)))], axis=1)
    mb = np.median(b[rng.integers(0, len(b), (resamples, len(b)))], axis=1)
    ratios = _ratios(ma, mb)
    tail = (1.0 - confidence) / 2
    return RatioInterval(ratio=reach_ratio(float(np.median(a)), float(np.median(b))),
                         low=float(np.quantile(ratios, tail, method="lower")),
                         high=float(np.quantile(ratios, 1 - tail, method="higher")),
                         share_below_1=float((ratios < 1.0).mean()))


def _ratios(ma: Any, mb: Any) -> Any:
    """[n] medians over [n] medians (numpy arrays): reach_ratio's rule, both "never" a tie (1)."""
    import numpy as np

    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(np.isinf(mb), 0.0, ma / np.where(mb > 0, mb, np.nan))
    r = np.where(np.isinf(ma) & np.isinf(mb), 1.0, r)
    return np.where(np.isinf(ma) & ~np.isinf(mb), np.inf, r)
